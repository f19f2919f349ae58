"""What the commands that talk to a running API share (``memstore ingest``, ``memstore search``):
its address and key as options, the key as a header, and a refusal as one readable line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
import httpx

from encoder.cli_support import SettingDefault

F = TypeVar("F", bound=Callable[..., Any])


def default_url() -> str:
    from memstore.settings import get_settings

    s = get_settings()
    return f"http://{s.host}:{s.port}"


def api_options(command: F) -> F:
    """``--url`` (MEMSTORE_API_URL, default this machine's server) and ``--key`` (MEMSTORE_API_KEY)."""
    command = click.option("--key", metavar="KEY", envvar="MEMSTORE_API_KEY", show_envvar=True, help="API key")(command)
    return click.option(
        "--url",
        metavar="URL",
        cls=SettingDefault,
        envvar="MEMSTORE_API_URL",
        show_envvar=True,
        default=default_url,
        help="the API",
    )(command)


def auth_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def post(prog: str, url: str, path: str, **request: Any) -> httpx.Response | None:
    """POST ``path`` to the API at ``url`` (``request``: httpx's arguments); its 200 answer, or None
    once the reason is printed as one line on stderr: the server unreachable, or its refusal."""
    return call(prog, "POST", url, path, **request)


def call(
    prog: str, method: str, url: str, path: str, *, ok: tuple[int, ...] = (200,), **request: Any
) -> httpx.Response | None:
    """``method`` ``path`` on the API at ``url``; its answer when its status is one of ``ok``, or None
    once the reason is printed as one line on stderr: the server unreachable, or its refusal."""
    try:
        r = httpx.request(method, f"{url}{path}", **request)
    except httpx.TransportError as exc:
        click.echo(f"{prog}: cannot reach {url} ({exc}); is `memstore serve` running?", err=True)
        return None
    if r.status_code not in ok:
        hint = " (give the key with --key or MEMSTORE_API_KEY)" if r.status_code == 401 else ""
        click.echo(f"{prog}: {problem(r)}{hint}", err=True)
        return None
    return r


def problem(r: httpx.Response) -> str:
    """An error answer as one line: status, title and the problem's detail."""
    try:
        body = r.json()
        return f"{r.status_code} {body.get('title', '')}: {body.get('detail', r.text)}"
    except ValueError:
        return f"{r.status_code} {r.text[:200]}"
