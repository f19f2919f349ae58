"""What every part of the store shares: its database, settings and registry cache."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import sqlalchemy as sa

from memstore.catalog.collections import (
    Collection,
)
from memstore.catalog.registry import (
    Registry,
)
from memstore.db import online_ddl
from memstore.db.core import Database, as_database
from memstore.items.sealing import Sealer
from memstore.search.runner import SecondWalks
from memstore.settings import Settings, get_settings


class StoreBase:
    """The store's database, settings and registry cache."""

    def __init__(self, db: Database | sa.Engine, *, settings: Settings | None = None) -> None:
        # A Database; an engine (``VectorStore(get_engine())`` in users' scripts) is still accepted
        # here, the one public entry point that takes one, and wrapped at once (the primary alone).
        self.db = as_database(db)
        self.settings = settings or get_settings()
        self.registry = Registry(self.db)
        self.second_walk_count = SecondWalks()
        # Seals and merges the graphs of the segmented collections this store writes to (a thread,
        # started by the first such write).
        self.sealer = Sealer(self.db, self.settings, changed=lambda c: self.registry.forget(c.name))

    def list_collections(self) -> list[Collection]:
        return self.registry.all()

    def get_collection(self, *, name: str, fresh: bool = False) -> Collection:
        return self.registry.get(name, fresh=fresh)

    def cached_collection(self, name: str) -> Collection | None:
        """The collection's registry row if this store read it recently, without touching the database."""
        return self.registry.cached(name)

    def forget_collection(self, name: str) -> None:
        """Drop a cached registry row (dropped, switched, or its table turned out to be gone)."""
        self.registry.forget(name)

    @contextmanager
    def _ddl_connection(self, application_name: str) -> Iterator[psycopg.Connection[Any]]:
        """An autocommit connection of its own, with the short lock wait online DDL is written for."""
        with self.db.dedicated(application_name=application_name) as conn:
            online_ddl.set_lock_timeout(conn)
            yield conn

    def _collection_for_write(self, name: str) -> Collection:
        return self.get_collection(name=name)
