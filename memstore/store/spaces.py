"""The store's embedding spaces after the first (``memstore.spaces.lifecycle``)."""

from __future__ import annotations

from typing import Any

from memstore.catalog.collections import (
    Collection,
    Space,
)
from memstore.errors import (
    ItemNotFoundError,
)
from memstore.items.vectors import as_vector
from memstore.spaces import lifecycle
from memstore.store.item_writes import ItemWritesPart


class SpacesPart(ItemWritesPart):
    """Embedding spaces."""

    def create_space(
        self,
        *,
        collection: str,
        name: str,
        model: str,
        dimensions: int,
        pretrained: str | None = None,
        metric: str | None = None,
        hnsw_m: int | None = None,
        hnsw_ef_construction: int | None = None,
        ef_search: int | None = None,
    ) -> Space:
        """A new embedding space of the collection, filled in the background from the stored originals
        by ingest workers that run ``model`` (its progress: ``space_progress``)."""
        c = self.get_collection(name=collection, fresh=True)
        with self._ddl_connection("memstore-spaces") as conn:
            space = lifecycle.create(
                conn,
                c,
                name=name,
                model=model,
                pretrained=pretrained,
                dimensions=dimensions,
                metric=metric,
                hnsw_m=hnsw_m,
                hnsw_ef_construction=hnsw_ef_construction,
                ef_search=ef_search,
            )
        self.forget_collection(collection)
        return space

    def space_progress(self, *, collection: str, name: str | None = None) -> lifecycle.Progress:
        """How far a space is filled (default: the active space)."""
        c = self.get_collection(name=collection, fresh=True)
        with self.db.write() as conn:  # the primary's counts: a replica may lag the queue
            return lifecycle.progress(conn, c, c.space(name))

    def activate_space(self, *, collection: str, name: str, force: bool = False) -> Collection:
        """Make ``name`` the space searches use when they name none (``lifecycle.activate`` says when it
        is refused); this process sees it at once, others within the registry's cache time. A space
        filled by ``put_space_vectors`` alone (nothing to embed) gets its index built here first."""
        c = self.get_collection(name=collection, fresh=True)
        if c.space(name).state == "filling":
            # Every vector written by hand and nothing to embed: built here, no worker needed.
            with self._ddl_connection("memstore-spaces") as conn:
                if lifecycle.finish_filled(conn, c, c.space(name)):
                    c = self.get_collection(name=collection, fresh=True)
        with self.db.write() as conn:
            lifecycle.activate(conn, c, name, force=force)
        self.forget_collection(collection)
        return self.get_collection(name=collection, fresh=True)

    def delete_space(self, *, collection: str, name: str) -> None:
        """Drop a space searches do not use, with its vectors and index."""
        c = self.get_collection(name=collection, fresh=True)
        with self._ddl_connection("memstore-spaces") as conn:
            lifecycle.delete(conn, c, name)
        self.forget_collection(collection)

    def put_space_vectors(self, *, collection: str, name: str, vectors: dict[str, Any]) -> int:
        """Write vectors into a side space by external id (items stored without an original need this
        before the space can be activated); returns how many were written."""
        c = self.get_collection(name=collection, fresh=True)
        space = c.space(name)
        checked = {
            eid: as_vector(v, dimensions=space.dimensions, metric=space.metric, where=f"vectors[{eid!r}]")
            for eid, v in vectors.items()
        }
        ids = self.find_external_ids(collection=collection, external_ids=list(checked))
        missing = [eid for eid in checked if eid not in ids]
        if missing:
            raise ItemNotFoundError(collection, missing[0])
        with self.db.write() as conn:
            return lifecycle.put_vectors(conn, c, space, {ids[eid]: v for eid, v in checked.items()})
