"""memstore's tests."""
