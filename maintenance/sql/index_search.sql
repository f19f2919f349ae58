-- The index's answer, as the store searches (iterative scan, re-sorted after the relaxed order).
WITH c AS MATERIALIZED (
    SELECT id, embedding {op} %(q)s AS distance FROM {table}
    WHERE embedding IS NOT NULL
    ORDER BY embedding {op} %(q)s LIMIT %(k)s
)
SELECT id, distance FROM c ORDER BY distance
