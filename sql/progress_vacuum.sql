SELECT phase, heap_blks_total, heap_blks_scanned, heap_blks_vacuumed, index_vacuum_count,
       indexes_total, indexes_processed
FROM pg_stat_progress_vacuum WHERE pid = %(pid)s
