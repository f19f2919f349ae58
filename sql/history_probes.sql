SELECT id, collection, partition_table, index_name, taken_at, live_rows, dead_rows, churn_since_rebuild,
       index_bytes, fresh_index_bytes, invalid_indexes, recall, recall_k, recall_sample, ef_search,
       duration_s, recommendation, details
FROM memstore_maintenance_probes
WHERE (%(collection)s::text IS NULL OR collection = %(collection)s)
  AND (%(since)s::timestamptz IS NULL OR taken_at >= %(since)s)
ORDER BY taken_at DESC, id DESC
LIMIT %(limit)s
