-- One search server's share of capacity for background work, and the latency it was set from
-- (memstore.services.foreground_signal): one row per process, rewritten in place. Returns how long
-- ago background work last ran in a process that follows (its idle windows leave that time out).
WITH written AS (
    INSERT INTO memstore_foreground AS f (source, kind, share, search_p99_ms, target_p99_ms, updated_at)
    VALUES (%(source)s, 'search', %(share)s, %(p99_ms)s, %(target_ms)s, clock_timestamp())
    ON CONFLICT (source) DO UPDATE
    SET kind = 'search',
        share = excluded.share,
        search_p99_ms = excluded.search_p99_ms,
        target_p99_ms = excluded.target_p99_ms,
        updated_at = excluded.updated_at
)
SELECT extract(epoch FROM clock_timestamp() - max(worked_at))::float8
FROM memstore_foreground
WHERE kind = 'background' AND source <> %(source)s
