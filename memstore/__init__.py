"""memstore."""
