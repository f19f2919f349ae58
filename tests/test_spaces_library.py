"""A second embedding space used from the library alone: filled by hand, activated without a worker."""

from __future__ import annotations

import numpy as np
import pytest

from memstore.errors import ConflictError
from memstore.models import ItemIn
from memstore.store import VectorStore


def test_a_space_filled_by_hand_is_activated_without_a_worker(store: VectorStore, collection_name: str) -> None:
    """Items stored as bare vectors have nothing to embed: once their vectors in the new space are
    given, activating it builds its index in this process (no ingest worker runs here)."""
    rng = np.random.default_rng(8)
    store.create_collection(name=collection_name, dimensions=4)
    store.upsert_items(
        collection=collection_name, items=[ItemIn(vector=rng.normal(size=4), external_id=f"v{i}") for i in range(30)]
    )
    store.create_space(collection=collection_name, name="wide", model="user", dimensions=6, metric="l2")
    wide = rng.normal(size=(30, 6)).astype(np.float32)
    store.put_space_vectors(collection=collection_name, name="wide", vectors={f"v{i}": wide[i] for i in range(29)})
    with pytest.raises(ConflictError, match="still filling"):
        store.activate_space(collection=collection_name, name="wide")  # v29 has no vector in it yet
    store.put_space_vectors(collection=collection_name, name="wide", vectors={"v29": wide[29]})
    c = store.activate_space(collection=collection_name, name="wide")
    assert c.active_space_name == "wide" and c.space("wide").state == "ready"
    assert [h.external_id for h in store.search(collection=collection_name, vector=wide[7], k=1)] == ["v7"]
