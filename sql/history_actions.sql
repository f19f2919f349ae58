SELECT id, collection, partition_table, index_name, action, reason, started_at, finished_at, duration_s,
       outcome, before, after, error
FROM memstore_maintenance_actions
WHERE (%(collection)s::text IS NULL OR collection = %(collection)s)
  AND (%(since)s::timestamptz IS NULL OR started_at >= %(since)s)
ORDER BY started_at DESC, id DESC
LIMIT %(limit)s
