"""What is read out of images beside their vectors: thumbnails, text (OCR) and photo facts.

May import: encoder, memstore.catalog, memstore.db, memstore.errors, memstore.inputs.
"""
