-- The most recent query vectors the API sampled for one collection (past the newest %(skip)s).
SELECT embedding FROM memstore_query_samples
WHERE collection_id = %(collection_id)s
ORDER BY id DESC
LIMIT %(n)s OFFSET %(skip)s
