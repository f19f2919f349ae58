"""The API routes, one module per resource."""
