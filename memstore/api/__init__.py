"""memstore's REST API: ``build_app`` in memstore.api.app. The web pages (``memstore.ui``) are built
on it; it never imports them, nor the maintenance worker.

May import: encoder, memstore.access, memstore.catalog, memstore.db, memstore.errors, memstore.inputs,
memstore.items, memstore.media, memstore.models, memstore.queue, memstore.search, memstore.services,
memstore.settings, memstore.spaces, memstore.store, memstore.workers.
"""
