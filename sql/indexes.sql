-- Every index on one table that maintenance cares about: the HNSW ones (valid or not) and any INVALID
-- leftover of an interrupted (RE)INDEX CONCURRENTLY, whatever its access method.
SELECT i.relname AS index_name,
       am.amname AS method,
       x.indisvalid AS valid,
       pg_relation_size(i.oid) AS bytes,
       EXISTS (SELECT 1 FROM pg_stat_progress_create_index p WHERE p.relid = x.indrelid) AS build_running
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_am am ON am.oid = i.relam
WHERE x.indrelid = to_regclass(%(table)s)
  AND (am.amname = 'hnsw' OR NOT x.indisvalid)
ORDER BY i.relname
