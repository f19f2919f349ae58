"""One send per event-loop turn: the writes a response makes in one turn go out as one segment.

uvicorn writes a response's head (status line and headers) and its body with two ``transport.write``
calls, and uvloop sends each at once: two system calls, and on a kept-alive connection two segments
for the client to wake for, where one would do (on loopback a send runs the receiver's side of TCP,
wake-up included, in the sender's system call). Sent as one, the server's CPU per search is the
same and its clients answer sooner: about 2% more REST searches a second, up to 6% with two
connections (``bench.api --servers serve,uncoalesced``, docs/performance.md).

``CoalescedWrites`` wraps the connection's transport: a write is held until the end of the loop's
current turn (``call_soon``), and every write made before then joins it. Nothing is reordered and
nothing waits longer than the rest of the turn, so streamed responses flow as before; a close, an
end of writing or a flow-control check sees the held bytes first.
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescedWrites:
    __slots__ = ("_held", "_loop", "_size", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: list[bytes] | None = None
        self._size = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        if self._held is None:
            self._held = [bytes(data)]
            self._loop.call_soon(self.flush)
        else:
            self._held.append(bytes(data))
        self._size += len(data)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def flush(self) -> None:
        held, self._held, self._size = self._held, None, 0
        if held and not self.transport.is_closing():
            self.transport.write(held[0] if len(held) == 1 else b"".join(held))

    def get_write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() + self._size

    def can_write_eof(self) -> bool:
        return self.transport.can_write_eof()

    def write_eof(self) -> None:
        self.flush()
        self.transport.write_eof()

    def close(self) -> None:
        self.flush()  # what was written before the close is sent before it, as asyncio's transports do
        self.transport.close()

    def abort(self) -> None:
        self._held, self._size = None, 0  # an abort discards unsent data
        self.transport.abort()

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading...
        return getattr(self.transport, name)
