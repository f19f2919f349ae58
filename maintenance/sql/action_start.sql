INSERT INTO memstore_maintenance_actions (collection, partition_table, index_name, action, reason, before)
VALUES (%(collection)s, %(partition_table)s, %(index_name)s, %(action)s, %(reason)s, %(before)s)
RETURNING id
