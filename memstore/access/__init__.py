"""Who may do what: API keys with scopes (``keys``) and the web pages' sessions (``ui_sessions``).

May import: memstore.catalog, memstore.db, memstore.errors.
"""
