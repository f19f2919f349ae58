"""What a memstore process runs beside the store: the encoder it hosts, the query sampler, the
latency tracker and in-process ingest workers. Each is a small object with start and close; the API
(``memstore.api.runtime``) and the commands compose them. Nothing here imports FastAPI.

May import: encoder, memstore.db, memstore.errors, memstore.queue, memstore.search, memstore.settings,
memstore.spaces, memstore.workers.
"""
