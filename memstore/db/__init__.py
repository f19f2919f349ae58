"""The database layer: connections and the one ``Database`` handle (``core``), the embedded server
and its standbys, advisory locks (every lock key), online DDL, retries of transient failures, the
search connections, named SQL files and migrations.

Nothing else renders a URL or opens a connection. The handles a user's script starts from are
importable from the package itself (``from memstore.db import get_engine``), as before the package
existed.

May import: memstore.errors, memstore.settings.
"""

from memstore.db.core import Database, get_database, get_engine

__all__ = ["Database", "get_database", "get_engine"]
