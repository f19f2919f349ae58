"""Who an image is decoded for, so that one tenant's images cannot hold every preprocessing thread.

The engine decodes images on a small pool of preprocessing threads (``encoder.workers.PriorityPool``),
highest priority class first. Within a class, each image's place is its tenant's number of images of
its weight (light or heavy, ``encoder.images.is_light``) already waiting or being decoded when it
arrives, then its deadline: a tenant that sent twenty images has its twenty-first queued behind
another tenant's first, however the two arrived. A decode may take up to the budget's time limit
(``MEMSTORE_ENCODER_DECODE_TIMEOUT_S``), so this is what keeps other tenants' small images and
queries flowing while one sends slow ones; the pool's light lane keeps one tenant's small pictures
flowing past its own huge ones.

The tenant is whatever the caller sets in ``TENANT`` before it submits (the engine reads it in the
calling thread): the API sets the request's key, the ingest worker the collection. A remote encoder
(``encoder.client``) sends it as the request's ``user``, and the service sets it from that. Unset,
every caller is one tenant, as before.
"""

from __future__ import annotations

from contextvars import ContextVar

TENANT: ContextVar[str] = ContextVar("memstore_encoder_tenant", default="")
