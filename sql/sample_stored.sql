-- Random stored vectors of one table, found through the id index (no full scan): a random id in
-- [min, max], then the first row at or after it. Gaps make some rows likelier; that is fine for a probe.
SELECT s.embedding
FROM (SELECT min(id) AS lo, max(id) AS hi FROM {table}) AS b,
     LATERAL (SELECT b.lo + floor(random() * (b.hi - b.lo + 1))::bigint AS pick
              FROM generate_series(1, %(n)s)) AS r,
     LATERAL (SELECT t.embedding FROM {table} AS t
              WHERE t.id >= r.pick AND t.embedding IS NOT NULL ORDER BY t.id LIMIT 1) AS s
