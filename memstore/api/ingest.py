"""Storing items from requests: vectors at once, texts and images through the durable queue (an
image with the facts its header holds added to its metadata: ``memstore.media.photo_facts``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi.concurrency import run_in_threadpool

from encoder.types import Priority
from memstore.api.problems import Problem
from memstore.api.runtime import Runtime
from memstore.api.schemas import ItemAck, ItemBody, ItemsAck, given_vector
from memstore.catalog import segments
from memstore.catalog.collections import Collection, Space
from memstore.inputs import check_item_text, check_metadata
from memstore.items.vectors import as_vector
from memstore.media import photo_facts
from memstore.models import ItemIn
from memstore.queue import claims, jobs
from memstore.queue.jobs import PendingItem
from memstore.spaces.model_choice import model_for

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestAnswer:
    status_code: int
    body: ItemsAck


def check_encodable(rt: Runtime, c: Collection, space: Space | None = None) -> dict[str, Any]:
    """Refuse texts/images for a collection (or one of its spaces) this server's encoder cannot fill
    (when it runs one); returns the keyword arguments that ask the encoder for its model."""
    if rt.encoder.backend is None:
        return {}
    how, refusal = model_for(rt.encoder.backend, c, space)
    if refusal:
        raise Problem("invalid-input", f"{refusal}; send vectors instead")
    return how


def split_json_items(rt: Runtime, c: Collection, items: Sequence[ItemBody]) -> tuple[list[int], list[int]]:
    """Check every item before anything is written; returns the indices of the items that bring their
    vector (and maybe a text, stored for keyword search as it is) and of the texts to embed."""
    if len(items) > rt.api.max_items_per_request:
        raise Problem(
            "payload-too-large",
            f"{len(items)} items in one request; the limit is {rt.api.max_items_per_request} "
            "(MEMSTORE_API_MAX_ITEMS_PER_REQUEST): split it",
            limit=rt.api.max_items_per_request,
        )
    vectors, texts = [], []
    for i, it in enumerate(items):
        vector = given_vector(it)
        if it.text is None and vector is None:
            raise Problem("invalid-input", f"items[{i}]: give a text, a vector, or both")
        check_metadata(it.metadata)
        if vector is not None:
            as_vector(vector, dimensions=c.dimensions, where=f"items[{i}].vector", metric=c.metric)
            if it.text is not None:
                # Stored for keyword search, never embedded: the store's limit, not the encoder's.
                check_item_text(it.text, f"items[{i}].text")
            vectors.append(i)
        else:
            assert it.text is not None
            check_text(rt, it.text, f"items[{i}].text")
            texts.append(i)
    if texts:
        check_encodable(rt, c)
    return vectors, texts


def check_text(rt: Runtime, text: str, where: str) -> None:
    if len(text) > rt.api.max_text_chars:
        raise Problem(
            "invalid-input",
            f"{where} has {len(text)} characters; the limit is {rt.api.max_text_chars} (MEMSTORE_API_MAX_TEXT_CHARS)",
            limit=rt.api.max_text_chars,
        )
    if not text.strip() or "\x00" in text:
        raise Problem("invalid-input", f"{where} must contain non-blank text without NUL characters")


async def store_json_items(rt: Runtime, c: Collection, items: Sequence[ItemBody], *, wait: bool) -> IngestAnswer:
    vector_idx, text_idx = split_json_items(rt, c, items)
    # The last occurrence of an external id wins, whether it and the earlier ones are texts to embed
    # or vectors (written by two paths, so the earlier ones are dropped here); each earlier one is
    # acknowledged as the row stored.
    last: dict[str | None, int] = {it.external_id: i for i, it in enumerate(items) if it.external_id is not None}
    vector_idx = [i for i in vector_idx if last.get(items[i].external_id, i) == i]
    text_idx = [i for i in text_idx if last.get(items[i].external_id, i) == i]
    acks: dict[int, ItemAck] = {}
    if vector_idx:
        batch = [
            ItemIn(
                vector=given_vector(items[i]),
                external_id=items[i].external_id,
                metadata=items[i].metadata,
                text=items[i].text,
            )
            for i in vector_idx
        ]
        if segments.segmented(c):
            await _room_in_tail(rt, c)
        results = await run_in_threadpool(
            lambda: rt.store.upsert_items(collection=c.name, items=batch, backpressure=False)
        )
        for i, r in zip(vector_idx, results, strict=True):
            acks[i] = ItemAck(id=r.id, external_id=r.external_id, status="ready", change=r.status)
    if text_idx:
        pending = [
            PendingItem(text=items[i].text, external_id=items[i].external_id, metadata=items[i].metadata)
            for i in text_idx
        ]
        for i, ack in zip(text_idx, await enqueue(rt, c, pending, wait=wait), strict=True):
            acks[i] = ack
    return outcome([acks[i] if i in acks else acks[last[items[i].external_id]] for i in range(len(items))])


async def _room_in_tail(rt: Runtime, c: Collection) -> None:
    """Wait, on the event loop and holding no thread, while a segmented collection's tail is over
    its bound (``Sealer.room``; at most ``Sealer.BACKLOG_WAIT_S``): a client that writes faster than
    the graphs are built is slowed to their pace, the rows it sent before all searchable."""
    sealer = rt.store.sealer
    deadline = time.monotonic() + sealer.BACKLOG_WAIT_S
    while not await run_in_threadpool(sealer.room, c) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


async def enqueue(
    rt: Runtime, c: Collection, pending: list[PendingItem], *, wait: bool, facts: bool = True
) -> list[ItemAck]:
    """Queue the items for embedding (``facts``: images get their photo facts, ``with_facts``)."""
    done = await run_in_threadpool(lambda: jobs.enqueue(rt.db, c, [with_facts(p) if facts else p for p in pending]))
    if segments.segmented(c):
        rt.store.sealer.wrote(c)  # its tail grew: sealed once its rows are embedded
    acks = [ItemAck(id=d.id, external_id=d.external_id, status=d.status, change=d.change) for d in done]
    waiting = sorted({a.id for a in acks if a.status == "pending"})
    if wait and waiting:
        state = await run_in_threadpool(settle, rt, c, waiting)
        acks = [
            a.model_copy(update={"status": state[a.id][0], "error": state[a.id][1]}) if a.id in state else a
            for a in acks
        ]
    return acks


def with_facts(item: PendingItem) -> PendingItem:
    """An image with its own facts (date taken, camera, place, size) added to its metadata, never
    over what the client sent (``memstore.media.photo_facts``): stored with the item, in the same insert."""
    if item.content is None:
        return item
    metadata = photo_facts.with_facts(item.metadata, item.content)
    return item if metadata is item.metadata else replace(item, metadata=metadata)


def settle(rt: Runtime, c: Collection, item_ids: list[int]) -> dict[int, tuple[str, Any]]:
    """Embed our own items now at the synchronous-ingest priority; wait for those a worker holds."""
    ours: set[int] = set()
    if rt.encoder.backend is not None:
        claimer = rt.claimer()
        # An item has a queue row per space of the collection (its own vector, and each side space's):
        # all are claimed, so the item is found by whichever space searches use when this answers.
        # It is ours when its own row is: that row's outcome is the item's status.
        held = claims.claim(
            rt.db, claimer, limit=len(item_ids) * len(c.all_spaces()), collection_id=c.id, item_ids=item_ids
        )
        ours = {cl.item_id for cl in held if cl.space_id == 0}
        if held:
            try:
                rt.processor().process(held, priority=Priority.SYNC_INGEST)
            except Exception as exc:  # the items are stored: a worker will take them over
                log.warning("?wait=true: encoding failed (%s); leaving the items to the workers", exc)
                try:
                    claims.release(rt.db, held, delay_s=0)
                except Exception:
                    claimer.connect()  # a new identity: the old claims become claimable at once
    others = [i for i in item_ids if i not in ours]
    state = jobs.statuses(rt.db, c, [i for i in item_ids if i in ours])
    if others:
        state |= jobs.wait_until_settled(rt.db, c, others, timeout=rt.ingest.wait_timeout_s)
    return state


def outcome(acks: list[ItemAck]) -> IngestAnswer:
    body = ItemsAck(items=acks)
    if any(a.status == "failed" for a in acks):
        raise Problem(
            "ingest-failed",
            "; ".join(f"{a.external_id}: {a.error}" for a in acks if a.status == "failed")[:2000],
            items=[a.model_dump() for a in acks],
        )
    return IngestAnswer(202 if any(a.status == "pending" for a in acks) else 201, body)
