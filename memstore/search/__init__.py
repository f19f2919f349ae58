"""Search: from a checked request to rows.

What a search asks for and how rows become results (``request``); filters compiled to SQL
(``filter_language``); the one statement builder and its settings (``statements``); the plan and the
runner, blocking and on the event loop (``plan``, ``runner``); exact answers and recall
(``exact_answers``); the query samples the recall probes draw (``query_samples``).

May import: memstore.catalog, memstore.compact, memstore.db, memstore.errors, memstore.inputs,
memstore.items, memstore.models, memstore.settings.
"""
