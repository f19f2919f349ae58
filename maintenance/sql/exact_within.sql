-- The exact distances from every row to every query in one scan of the table, keeping only the rows
-- that lie within some query's bound (the distance of the index's k-th answer to it: those k rows
-- exist, so the true k nearest lie within it too). vector(embedding, dims, true) detoasts each stored
-- vector once for all the queries, not once per distance (a 1024-d vector lives out of line).
SELECT id, d FROM (
    SELECT id, ARRAY[{distances}] AS d
    FROM (SELECT id, vector(embedding, %(dims)s, true) AS e FROM {table}
          WHERE embedding IS NOT NULL OFFSET 0) AS t
    OFFSET 0
) AS s
WHERE {within}
