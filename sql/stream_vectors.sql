-- Every stored vector of one table, as one binary COPY (memstore.db.vector_copy parses it in chunks):
-- the exact answers to many queries at once are ranked in the client, one pass over the table.
COPY (SELECT id, embedding FROM {table} WHERE embedding IS NOT NULL) TO STDOUT (FORMAT BINARY)
