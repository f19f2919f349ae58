"""Embedding spaces: a collection's vectors from a second model, in side tables of their own
(``lifecycle``), and which of the encoder's models fills a collection or a space (``model_choice``).

May import: encoder, memstore.catalog, memstore.db, memstore.errors, memstore.queue.
"""
