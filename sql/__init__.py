"""Named SQL files (probes and maintenance statements), installed as the package ``memstore_sql``
(``pyproject.toml`` maps it from this folder); ``memstore.db.sqlfiles`` loads them by name."""
