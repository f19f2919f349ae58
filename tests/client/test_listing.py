"""The client's listing by metadata filter (GET and POST), counting, and the server's models."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from memstore_client import AsyncClient, Client, InvalidInputError, ItemIn

from tests.client.conftest import Served


@pytest.fixture
def ms(served: Served) -> Any:
    with Client(served.url, api_key=served.key) as c:
        yield c


def _fill(ms: Client, name: str, n: int = 9) -> None:
    ms.create_collection(name, dimensions=3)
    items = [
        ItemIn(
            external_id=f"e{i}",
            vector=[1.0, float(i), 0.5],
            metadata={"source": "/notes" if i % 3 else "/photos", "i": i},
        )
        for i in range(n)
    ]
    ms.add_items(name, items)


def test_list_iterate_and_count_by_filter(ms: Client, name: str) -> None:
    _fill(ms, name)
    notes = {"source": "/notes"}
    page = ms.query_items(name, filter=notes, limit=4)
    assert [i.external_id for i in page.items] == ["e1", "e2", "e4", "e5"]
    assert page.next_after == page.items[-1].id
    rest = ms.query_items(name, filter=notes, after=page.next_after or 0, limit=4)
    assert [i.external_id for i in rest.items] == ["e7", "e8"] and rest.next_after is None
    walked = [i.external_id for i in ms.iter_items(name, filter=notes, page_size=2)]
    assert walked == ["e1", "e2", "e4", "e5", "e7", "e8"]
    by_get = ms.list_items(name, filter={"source": "/photos"}, limit=2)
    assert [i.external_id for i in by_get.items] == ["e0", "e3"] and by_get.next_after is not None
    assert ms.count_items(name, filter=notes) == 6
    assert ms.count_items(name, filter={"i": {"$gte": 7}}) == 2
    assert ms.count_items(name) == 9
    assert ms.count_items(name, status="pending") == 0
    assert [i.external_id for i in ms.iter_items(name, filter={"source": "/elsewhere"})] == []
    with pytest.raises(InvalidInputError):
        ms.query_items(name, filter={"i": {"$bogus": 1}})


def test_the_async_client_lists_and_counts_by_filter(ms: Client, served: Served, name: str) -> None:
    _fill(ms, name)

    async def scenario() -> None:
        async with AsyncClient(served.url, api_key=served.key) as a:
            walked = [i.external_id async for i in a.iter_items(name, filter={"source": "/photos"}, page_size=2)]
            assert walked == ["e0", "e3", "e6"]
            page = await a.list_items(name, filter={"source": "/notes"}, limit=1)
            assert [i.external_id for i in page.items] == ["e1"]
            assert await a.count_items(name, filter={"source": "/notes"}) == 6
            assert (await a.query_items(name, filter={"i": 4})).items[0].external_id == "e4"

    asyncio.run(scenario())


def test_models_names_what_the_encoder_runs(server: Any, admin_key: str) -> None:
    with Client(server.url, api_key=admin_key) as c:
        models = c.models()
    assert models[0]["id"] == "memstore-tiny" and models[0]["dimensions"] == 64
