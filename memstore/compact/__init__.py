"""Compact index representations: halfvec, binary and low-rank HNSW indexes with exact re-ranking.

- ``spec``: what a collection's index holds (``memstore_collections.options["index"]``) and the pool
  size of candidates re-ranked on full vectors;
- ``projection``: PCA fitting, versioned storage, and application of low-rank projections;
- ``ddl`` and ``switch``: building, flipping and dropping indexes online;
- ``search``: the two-stage query the store runs on a compact index;
- ``maintain``: ``maintain_compact_index``, the maintenance action that measures compact recall and
  refits/rebuilds when it falls (recorded in ``memstore_maintenance_actions``).

Submodules are imported lazily: ``memstore.collections`` imports ``spec``, and the others import
``memstore.collections``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["IndexSpec", "index_spec", "maintain_compact_index", "set_representation"]


def __getattr__(name: str) -> Any:
    if name == "maintain_compact_index":
        from memstore.compact.maintain import maintain_compact_index

        return maintain_compact_index
    if name in ("IndexSpec", "index_spec"):
        from memstore.compact import spec

        return getattr(spec, name)
    if name == "set_representation":
        from memstore.compact.switch import set_representation

        return set_representation
    raise AttributeError(name)
