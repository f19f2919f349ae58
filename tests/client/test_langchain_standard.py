"""LangChain's standard vector store tests (``langchain-tests``) against a real ``memstore serve
--no-encoder`` with keys: a fresh collection per test, sync and async."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator

import pytest
from langchain_tests.integration_tests import VectorStoreIntegrationTests
from memstore_client.langchain import MemstoreVectorStore

from tests.client.conftest import Served

# The suite's async tests are plain coroutines (their projects run pytest-asyncio in auto mode); this
# project runs it in strict mode, so they are marked here, on the suite's own functions.
for _name, _test in vars(VectorStoreIntegrationTests).items():
    if _name.startswith("test_") and inspect.iscoroutinefunction(_test):
        pytest.mark.asyncio(_test)


class TestMemstoreVectorStore(VectorStoreIntegrationTests):
    @pytest.fixture
    def vectorstore(self, served: Served) -> Iterator[MemstoreVectorStore]:
        store = MemstoreVectorStore(
            embedding=self.get_embeddings(),
            collection=f"lc_{uuid.uuid4().hex[:12]}",
            url=served.url,
            api_key=served.key,
        )
        try:
            yield store
        finally:
            store.delete_collection()
            store.close()
