"""Limits on what a client may make the server hold before a request reaches the application.

uvicorn's default HTTP implementation (httptools) buffers a request's head however large it grows
(httptools joins each header's pieces in memory) and has no deadline for it: one client sending
endless header lines, or one byte a second, holds memory or a connection for as long as it likes.
``GuardedHttpToolsProtocol`` is uvicorn's httptools protocol with three limits of its own, checked
as bytes arrive, before any ASGI code runs:

- the request head (request line and header lines together) is at most ``max_head_bytes``, in at most
  ``max_header_lines`` header lines: beyond either, a ``431`` and the connection is closed (the
  memory a connection holds is bounded by the limit and one socket read, 256 KiB);
- the whole head must arrive within ``head_timeout_s`` of its first byte (of the connection's
  opening, for a new connection): otherwise a ``408`` and the connection is closed;
- an idle keep-alive connection is closed after ``keep_alive_s`` (uvicorn's ``timeout_keep_alive``).

It also sends what a response writes in one turn of the event loop as one segment
(``memstore.api.coalesced_writes``): uvicorn writes the head and the body of a response separately.

``memstore serve`` runs uvicorn with it (``server_config``); behind a proxy, set the proxy's own
limits too (docs/operations.md).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
import uvicorn
import uvicorn.config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from memstore.api.coalesced_writes import CoalescedWrites
from memstore.settings import ApiSettings


@dataclass(frozen=True)
class HttpLimits:
    max_head_bytes: int = 64 * 1024
    max_header_lines: int = 100
    head_timeout_s: float = 10.0
    keep_alive_s: int = 5

    @classmethod
    def of(cls, api: ApiSettings) -> HttpLimits:
        return cls(
            max_head_bytes=api.max_head_bytes,
            max_header_lines=api.max_header_lines,
            head_timeout_s=api.head_timeout_s,
            keep_alive_s=api.keep_alive_s,
        )


class _HeadRefusedError(Exception):
    """Raised in a parser callback: the head is over a limit (httptools stops parsing)."""


def _answer(status: bytes, text: str) -> bytes:
    body = text.encode("ascii")
    return (
        b"HTTP/1.1 " + status + b"\r\ncontent-type: text/plain; charset=utf-8\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body
    )


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bounded request head and a deadline for it (see the module)."""

    limits: ClassVar[HttpLimits] = HttpLimits()
    coalesce_writes: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between requests, or in a head not yet complete
        self._head_bytes = 0  # raw bytes received since the head began (a read's worth may be body)
        self._head_size = 0  # the request line and header lines parsed so far
        self._head_lines = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # The connection

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if self.coalesce_writes:
            transport = CoalescedWrites(transport, self.loop)  # type: ignore[assignment]
        super().connection_made(transport)
        self._arm_head_timer()  # a new connection must send a whole head in time, starting now

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's own, with the head's bytes counted and a refusal's parser error kept quiet.
        if self._refused:
            return
        if self._in_head:
            self._head_bytes += len(data)
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if not self._refused:  # a malformed request, not one refused here: uvicorn's 400
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            return
        if self._in_head and self._head_bytes > self.limits.max_head_bytes:
            # Parsed so far without a complete head: cut off before httptools buffers more of it.
            self._refuse_head()

    # Parser callbacks (httptools calls them while data_received feeds it)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_size = 0
        self._head_lines = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        self._head_size += len(url)
        self._check_head()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_lines += 1
        self._head_size += len(name) + len(value) + 4
        self._check_head()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # whatever comes next is the next request's head
        self._head_bytes = 0

    # The limits

    def _check_head(self) -> None:
        if self._head_lines > self.limits.max_header_lines or self._head_size > self.limits.max_head_bytes:
            self._refuse_head()
            raise _HeadRefusedError  # stops the parser; data_received returns quietly

    def _refuse_head(self) -> None:
        self._refused = True
        self._disarm_head_timer()
        if self.transport.is_closing():
            return
        self.transport.write(
            _answer(
                b"431 Request Header Fields Too Large",
                f"the request head is over {self.limits.max_head_bytes} bytes or "
                f"{self.limits.max_header_lines} header lines "
                "(MEMSTORE_API_MAX_HEAD_BYTES, MEMSTORE_API_MAX_HEADER_LINES)\n",
            )
        )
        self.transport.close()

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.limits.head_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._in_head or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A pipelined head arriving while the previous request is answered: wait for that first.
            self._arm_head_timer()
            return
        self._refused = True
        self.transport.write(
            _answer(
                b"408 Request Timeout",
                f"the request head did not arrive within {self.limits.head_timeout_s:g} s "
                "(MEMSTORE_API_HEAD_TIMEOUT_S)\n",
            )
        )
        self.transport.close()


def protocol_class(limits: HttpLimits, *, coalesce_writes: bool = True) -> type[GuardedHttpToolsProtocol]:
    """``GuardedHttpToolsProtocol`` with ``limits`` (uvicorn builds one protocol per connection from a
    class, so the limits travel as a class attribute); ``coalesce_writes=False`` for comparisons only."""
    attributes = {"limits": limits, "coalesce_writes": coalesce_writes}
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), attributes)


def logging_config() -> dict[str, Any]:
    """uvicorn's logging configuration with ``memstore.access`` (the sampled access log,
    ``memstore.api.middleware.AccessLog``) on the handler and format of uvicorn's access lines."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["memstore.access"] = {"handlers": ["access"], "level": "INFO", "propagate": False}
    return config


def server_config(
    app: Any,
    api: ApiSettings,
    *,
    host: str,
    port: int,
    http: str | type[asyncio.Protocol] | None = None,
    **options: Any,
) -> uvicorn.Config:
    """uvicorn's configuration as ``memstore serve`` runs it: the guarded protocol, the keep-alive
    timeout, uvicorn's access log when ``MEMSTORE_API_ACCESS_LOG=all``, and ``options`` (log level,
    loop...). ``http`` names another of uvicorn's protocols instead of the guarded one: for
    comparisons only (``bench.api --servers``), since it drops the limits on the head."""
    limits = HttpLimits.of(api)
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=http or protocol_class(limits),
        timeout_keep_alive=limits.keep_alive_s,
        access_log=api.access_log == "all",
        log_config=logging_config(),
        **options,
    )


def run_server(app: Any, api: ApiSettings, *, host: str, port: int, log_level: str = "info", **options: Any) -> None:
    """Serve ``app`` as ``memstore serve`` does, until the process is told to stop."""
    uvicorn.Server(server_config(app, api, host=host, port=port, log_level=log_level, **options)).run()
