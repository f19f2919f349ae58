-- Brute force (run with enable_indexscan off): the ground truth for recall.
SELECT id, embedding {op} %(q)s AS distance FROM {table}
WHERE embedding IS NOT NULL
ORDER BY embedding {op} %(q)s LIMIT %(k)s
