"""The vector store: the Python API over collections, items, spaces and search.

Every public method is keyword-only and raises memstore's own errors (``memstore.errors``); bad input
is refused before anything is written. The REST API, the ingest workers and maintenance all use it.

``VectorStore`` is one object to its callers and five parts to its readers, one module each, each
built on the one before: ``collections`` (and their indexes), ``item_reads``, ``item_writes``,
``spaces`` and ``search``, over ``base`` (the database, settings and registry cache). The parts
check arguments and call the packages that own the work: ``memstore.catalog``, ``memstore.items``, ``memstore.queue``,
``memstore.spaces``, ``memstore.search`` (planning and running), ``memstore.compact``.

May import: memstore.catalog, memstore.compact, memstore.db, memstore.errors, memstore.inputs,
memstore.items, memstore.models, memstore.queue, memstore.search, memstore.settings, memstore.spaces.
"""

from memstore.store.search import SearchPart


class VectorStore(SearchPart):
    """Collections and their items in one PostgreSQL database, reached through ``db`` (a ``Database``)."""


__all__ = ["VectorStore"]
