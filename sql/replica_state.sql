-- A standby's health, read by memstore.db.core.Database.probe on the standby: whether it is one, the
-- WAL position it has replayed (its lag is read from the primary's timeline, memstore.db.replica_lag),
-- and its own view of its lag for when the primary cannot be read: zero when it has replayed all it
-- received (an idle primary sends nothing, so the last replayed commit's age would read as lag),
-- otherwise that age (which overstates the lag while the primary runs a long transaction).
SELECT pg_is_in_recovery(),
       (pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::bigint,
       CASE WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0
            ELSE extract(epoch FROM now() - pg_last_xact_replay_timestamp()) END
