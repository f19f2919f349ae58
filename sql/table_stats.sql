-- Live/dead rows, cumulative churn counters and the index cleanup option of one table, and the size
-- of its index. Counters come from the cumulative statistics system, whose snapshot lasts a
-- transaction: call pg_stat_clear_snapshot() first when reading twice in one.
SELECT greatest(c.reltuples, 0)::bigint AS reltuples,
       coalesce(s.n_live_tup, 0) AS n_live_tup,
       coalesce(s.n_dead_tup, 0) AS n_dead_tup,
       coalesce(s.n_tup_ins, 0) AS n_tup_ins,
       coalesce(s.n_tup_upd, 0) AS n_tup_upd,
       coalesce(s.n_tup_hot_upd, 0) AS n_tup_hot_upd,
       coalesce(s.n_tup_del, 0) AS n_tup_del,
       s.last_vacuum,
       s.last_autovacuum,
       coalesce(s.autovacuum_count, 0) AS autovacuum_count,
       (SELECT o.option_value FROM pg_options_to_table(c.reloptions) o
        WHERE o.option_name = 'vacuum_index_cleanup') AS index_cleanup,
       pg_table_size(c.oid) AS table_bytes,
       coalesce(pg_relation_size(to_regclass(%(index)s)), 0) AS index_bytes,
       -- rows given their first vector by an UPDATE (migration 0017): no HNSW element died for them
       coalesce((SELECT f.fills FROM memstore_vector_fills f WHERE f.table_name = c.oid::regclass::text), 0)
           AS vector_fills
FROM pg_class c
LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = to_regclass(%(table)s)
