"""Compact index representations: halfvec, binary and low-rank HNSW indexes with exact re-ranking.

- ``projection``: PCA fitting, versioned storage, and application of low-rank projections;
- ``ddl`` and ``switch``: building, flipping and dropping indexes online;
- ``search``: the two-stage query the store runs on a compact index.

What an index holds is the catalog's (``memstore.catalog.index_spec``); the maintenance action that
measures compact recall and refits or rebuilds is the maintenance worker's
(``maintenance.compact_index``).

May import: ``memstore.catalog``, ``memstore.db``, ``memstore.search`` (statements), ``memstore.errors``.
"""
