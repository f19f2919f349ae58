"""Subcommands of the ``memstore`` CLI, one module each."""
