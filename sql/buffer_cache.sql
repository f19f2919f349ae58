-- The bytes of every HNSW index in this database, and of the server's buffer cache (shared_buffers):
-- searches read graph pages through the kernel's cache once the indexes outgrow it.
SELECT
    coalesce(sum(pg_relation_size(i.oid)), 0)::bigint AS hnsw_bytes,
    (SELECT setting::bigint * pg_size_bytes(unit) FROM pg_settings WHERE name = 'shared_buffers') AS buffer_bytes
FROM pg_class AS i
JOIN pg_am AS a ON a.oid = i.relam
WHERE a.amname = 'hnsw' AND i.relkind = 'i'
