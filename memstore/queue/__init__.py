"""The durable ingest queue: the only writers of ``memstore_ingest_queue``.

``jobs`` enqueues items and reports the queue's depth; ``claims`` is how workers claim rows and
settle their claims.

May import: memstore.catalog, memstore.db, memstore.errors, memstore.inputs, memstore.settings.
"""
