-- A random sample of the query vectors the API kept for one collection (its most recent thousand),
-- leaving out the ones given (a confirming sample's first): not the newest few, which repeat from one
-- probe to the next and may all come from one user's burst of similar queries.
SELECT id, embedding FROM memstore_query_samples
WHERE collection_id = %(collection_id)s AND id <> ALL (%(exclude)s::bigint[])
ORDER BY random()
LIMIT %(n)s
