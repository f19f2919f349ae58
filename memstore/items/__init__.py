"""Items: what callers store, checked and written.

Vectors converted in one place (``vectors``); rows written and read (``writes``); loads at index-build
speed (``bulk_load``) from NDJSON files (``load_file``); ordered listings and their cursors
(``ordering``).

May import: memstore.catalog, memstore.db, memstore.errors, memstore.inputs, memstore.models,
memstore.queue, memstore.settings.
"""
