UPDATE memstore_maintenance_actions
SET finished_at = now(), duration_s = %(duration_s)s, outcome = %(outcome)s, after = %(after)s, error = %(error)s
WHERE id = %(id)s
