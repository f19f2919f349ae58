-- A process's row in memstore_foreground, deleted as the process stops (memstore.services.foreground_signal).
DELETE FROM memstore_foreground WHERE source = %(source)s
