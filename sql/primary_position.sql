-- The primary's WAL position, as a number, once a replica probe (memstore.db.replica_lag).
SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint
