"""The ingest worker and the passes it runs between batches: OCR, photo facts, new spaces.

May import: encoder, memstore.catalog, memstore.db, memstore.errors, memstore.media, memstore.queue,
memstore.settings, memstore.spaces.
"""
