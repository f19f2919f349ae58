-- One search server's share of capacity for background work, and the latency it was set from
-- (memstore.services.foreground_signal): one row per process, rewritten in place.
INSERT INTO memstore_foreground AS f (source, share, search_p99_ms, target_p99_ms, updated_at)
VALUES (%(source)s, %(share)s, %(p99_ms)s, %(target_ms)s, clock_timestamp())
ON CONFLICT (source) DO UPDATE
SET share = excluded.share,
    search_p99_ms = excluded.search_p99_ms,
    target_p99_ms = excluded.target_p99_ms,
    updated_at = excluded.updated_at
