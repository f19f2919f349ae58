"""``memstore.api.coalesced_writes``: the writes of one event-loop turn go out as one, in order, and
nothing written is held past the turn, dropped before a close or hidden from flow control."""

from __future__ import annotations

import asyncio
from typing import Any

from memstore.api.coalesced_writes import CoalescedWrites


class Recorder:
    """A transport that records what reaches it."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.events: list[str] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.sent.append(bytes(data))
        self.events.append("write")

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True
        self.events.append("close")

    def abort(self) -> None:
        self.closing = True
        self.events.append("abort")

    def get_write_buffer_size(self) -> int:
        return 7

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.events.append("eof")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


def _run(body: Any) -> None:
    asyncio.run(body())


def test_the_writes_of_one_turn_reach_the_transport_as_one_in_order() -> None:
    async def body() -> None:
        raw = Recorder()
        t = CoalescedWrites(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        t.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")
        t.write(bytearray(b"hel"))
        t.write(memoryview(b"lo"))
        t.write(b"")  # nothing to send: changes nothing
        assert raw.sent == []  # held until the turn ends
        assert t.get_write_buffer_size() == 7 + len(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
        await asyncio.sleep(0)
        assert raw.sent == [b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello"]
        assert t.get_write_buffer_size() == 7
        t.writelines([b"a", b"b"])  # the next turn's writes: a send of their own
        await asyncio.sleep(0)
        assert raw.sent[1:] == [b"ab"]

    _run(body)


def test_a_close_or_an_end_of_writing_sends_what_was_held_first_and_an_abort_drops_it() -> None:
    async def body() -> None:
        loop = asyncio.get_running_loop()
        raw = Recorder()
        t = CoalescedWrites(raw, loop)  # type: ignore[arg-type]
        t.write(b"last words")
        t.close()
        assert raw.sent == [b"last words"] and raw.events == ["write", "close"]
        await asyncio.sleep(0)  # the turn's own flush finds nothing left, and a closing transport
        assert raw.sent == [b"last words"]

        raw = Recorder()
        t = CoalescedWrites(raw, loop)  # type: ignore[arg-type]
        t.write(b"body")
        t.write_eof()
        assert raw.events == ["write", "eof"]

        raw = Recorder()
        t = CoalescedWrites(raw, loop)  # type: ignore[arg-type]
        t.write(b"never sent")
        t.abort()
        await asyncio.sleep(0)
        assert raw.sent == [] and raw.events == ["abort"] and t.get_write_buffer_size() == 7

    _run(body)


def test_everything_else_is_the_transport_s_own() -> None:
    async def body() -> None:
        raw = Recorder()
        t = CoalescedWrites(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
        assert t.get_extra_info("peername") == ("127.0.0.1", 1)
        assert t.can_write_eof() and not t.is_closing()
        raw.closing = True
        assert t.is_closing()
        t.write(b"to a closing transport")
        await asyncio.sleep(0)
        assert raw.sent == []  # as asyncio's own transports: nothing written once closing

    _run(body)
