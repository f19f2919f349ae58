"""The collection registry: one reader, one cache, one rule for when a change is seen."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from memstore.catalog.registry import Registry
from memstore.db.core import Database
from memstore.errors import CollectionExistsError, CollectionNotFoundError
from memstore.store import VectorStore


def test_a_change_made_elsewhere_is_seen_once_the_cache_expires(
    store: VectorStore, engine: sa.Engine, collection_name: str
) -> None:
    """Another process (here: another Registry) keeps its copy for ttl seconds, then reads again;
    the process that made the change forgets its copy at once."""
    c = store.create_collection(name=collection_name, dimensions=3)
    other = Registry(Database(engine), ttl=3600)
    assert other.get(collection_name).id == c.id
    store.set_index_representation(collection=collection_name, representation="halfvec", grace_s=0)
    assert store.get_collection(name=collection_name).options != c.options  # the writer sees it at once
    assert other.get(collection_name).options == c.options  # the other still trusts its copy
    other.ttl = 0.0
    assert other.get(collection_name).options != c.options  # and reads again once it expires


def test_ids_names_drops_and_duplicates(store: VectorStore, engine: sa.Engine, collection_name: str) -> None:
    c = store.create_collection(name=collection_name, dimensions=3)
    registry = Registry(Database(engine))
    assert registry.by_id(c.id) == registry.get(collection_name) == c
    assert registry.cached(collection_name) == c
    with pytest.raises(CollectionExistsError):
        store.create_collection(name=collection_name, dimensions=3)
    store.drop_collection(name=collection_name)
    assert store.registry.cached(collection_name) is None
    assert registry.by_id(c.id, fresh=True) is None
    with pytest.raises(CollectionNotFoundError):
        registry.get(collection_name, fresh=True)
    assert registry.cached(collection_name) is None


def test_a_segmented_collection_is_read_again_sooner(
    store: VectorStore, engine: sa.Engine, collection_name: str
) -> None:
    """A segmented collection's row changes with every seal, and a process on an older layout reads
    the rows sealed since exactly: another process trusts its copy for ``layout_ttl``, where any other
    row is trusted for ``ttl``."""
    plain_name = f"{collection_name}_plain"
    store.create_collection(name=collection_name, dimensions=3, write_path="segments")
    store.create_collection(name=plain_name, dimensions=3)
    try:
        other = Registry(Database(engine), ttl=3600, layout_ttl=0.05)
        segmented, plain = other.get(collection_name), other.get(plain_name)
        time.sleep(0.1)
        assert other.cached(plain_name) == plain
        assert other.cached(collection_name) is None  # the next search reads its layout again
        assert other.get(collection_name).id == segmented.id
        assert Registry(Database(engine)).layout_ttl < Registry(Database(engine)).ttl  # the defaults
    finally:
        store.drop_collection(name=plain_name)
