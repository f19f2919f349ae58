"""The catalog: what a collection is and how its tables and indexes are made.

The collection and space types, naming rules and table DDL (``collections``); the registry, the one
reader of ``memstore_collections`` (``registry``); which representation its HNSW index holds
(``index_spec``); its keyword index (``keywords``), typed metadata indexes (``metadata_indexes``, on the
expressions of ``metadata_sql``) and OCR columns (``ocr_items``).

May import: memstore.db, memstore.errors, memstore.settings.
"""
