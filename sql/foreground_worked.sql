-- A follower's last unit of background work, %(ago_s)s seconds ago (the search servers' baselines
-- leave out the windows around it).
INSERT INTO memstore_foreground AS f (source, kind, share, worked_at, updated_at)
VALUES (%(source)s, 'background', %(share)s, clock_timestamp() - make_interval(secs => %(ago_s)s), clock_timestamp())
ON CONFLICT (source) DO UPDATE
SET kind = 'background',
    share = excluded.share,
    worked_at = excluded.worked_at,
    updated_at = excluded.updated_at
