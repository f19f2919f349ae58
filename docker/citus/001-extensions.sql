-- Every node, on first start: Citus (first, it must be preloaded) and pgvector in the memstore database.
CREATE EXTENSION IF NOT EXISTS citus;
CREATE EXTENSION IF NOT EXISTS vector;
