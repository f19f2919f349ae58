-- The last successful action that left the index clean (rebuilt, or vacuumed with index cleanup),
-- with the churn counters it recorded afterwards; and the last rebuild. ('compact' is what a rebuild
-- was called in the history written before the rename.)
SELECT
  (SELECT row_to_json(a) FROM (
     SELECT id, action, finished_at, after FROM memstore_maintenance_actions
     WHERE partition_table = %(table)s AND outcome = 'ok' AND action IN ('rebuild', 'compact', 'vacuum', 'own_index_cleanup')
     ORDER BY finished_at DESC LIMIT 1) AS a) AS last_clean,
  (SELECT row_to_json(a) FROM (
     SELECT id, action, finished_at, duration_s, after FROM memstore_maintenance_actions
     WHERE partition_table = %(table)s AND outcome = 'ok' AND action IN ('rebuild', 'compact')
     ORDER BY finished_at DESC LIMIT 1) AS a) AS last_compact,
  (SELECT row_to_json(a) FROM (
     SELECT id, action, outcome, reason, finished_at FROM memstore_maintenance_actions
     WHERE partition_table = %(table)s
     ORDER BY started_at DESC LIMIT 1) AS a) AS last_action,
  (SELECT row_to_json(p) FROM (
     SELECT recall, taken_at, details -> 'counters' AS counters FROM memstore_maintenance_probes
     WHERE partition_table = %(table)s AND recall IS NOT NULL
     ORDER BY taken_at DESC LIMIT 1) AS p) AS last_recall
