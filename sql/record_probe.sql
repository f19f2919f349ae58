INSERT INTO memstore_maintenance_probes (
    collection, partition_table, index_name, live_rows, dead_rows, churn_since_rebuild, index_bytes,
    fresh_index_bytes, invalid_indexes, recall, recall_k, recall_sample, ef_search, duration_s,
    recommendation, details)
VALUES (%(collection)s, %(partition_table)s, %(index_name)s, %(live_rows)s, %(dead_rows)s,
    %(churn_since_rebuild)s, %(index_bytes)s, %(fresh_index_bytes)s, %(invalid_indexes)s, %(recall)s,
    %(recall_k)s, %(recall_sample)s, %(ef_search)s, %(duration_s)s, %(recommendation)s, %(details)s)
RETURNING id, taken_at
