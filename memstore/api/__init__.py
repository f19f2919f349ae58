"""memstore's REST API: ``create_app`` in memstore.api.app."""
