"""The start-up freeze (encoder.gc_freeze): garbage collected first, the rest kept out of the
collector's passes; off when told. `memstore serve` freezes by default (tests/test_cli.py checks it on
a real server); the test process does not (tests/conftest.py), so each test restores the collector."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from encoder.gc_freeze import freeze_startup


@pytest.fixture
def collector() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # back into the oldest generation: later tests' garbage is collected as usual


class Node:
    other: Node | None = None


def test_the_freeze_collects_garbage_first_then_keeps_the_living_out_of_collections(collector: None) -> None:
    first, second = Node(), Node()
    first.other, second.other = second, first  # a cycle only the collector can free
    gone = weakref.ref(first)
    del first, second
    living = {"kept": [1, 2, 3]}

    frozen = freeze_startup("a test")

    assert gone() is None  # the garbage was collected, not kept for ever
    # Not equal to get_freeze_count() later: a frozen object another thread frees leaves the count.
    assert frozen > 0 and gc.get_freeze_count() > 0
    assert not any(o is living for o in gc.get_objects())  # out of every generation the collector walks
    made_after = {"new": []}
    assert any(o is made_after for o in gc.get_objects())  # what comes later is collected as usual


def test_the_freeze_does_nothing_when_switched_off(collector: None) -> None:
    living = {"kept": [1]}
    assert freeze_startup("a test", enabled=False) == 0
    assert gc.get_freeze_count() == 0
    assert any(o is living for o in gc.get_objects())
