"""The database layer: connections and the one ``Database`` handle (``core``), the embedded server
and its standbys, advisory locks (every lock key), online DDL, retries of transient failures, the
search connections, named SQL files and migrations.

Nothing else renders a URL or opens a connection.

May import: memstore.errors, memstore.settings.
"""
