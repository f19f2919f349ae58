"""The alembic environment and revisions, installed as the package ``memstore_migrations``
(``pyproject.toml`` maps it from this folder); ``memstore.db.migrate`` points alembic here."""
