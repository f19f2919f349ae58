"""Compact index representations: halfvec, binary and low-rank HNSW indexes with exact re-ranking.

- ``projection``: PCA fitting, versioned storage, and application of low-rank projections;
- ``ddl`` and ``switch``: building, flipping and dropping indexes online.

What an index holds is the catalog's (``memstore.catalog.index_spec``); the two-stage query on a
compact index is the search's (``memstore.search.compact``); the maintenance action that
measures compact recall and refits or rebuilds is the maintenance worker's
(``maintenance.compact_index``).

May import: memstore.catalog, memstore.db, memstore.errors.
"""
