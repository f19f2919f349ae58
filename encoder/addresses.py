"""Addresses, for both services (the encoder's and the API): whether a listening address is
reachable from this machine only (they refuse to run open on any other: the encoder without its key,
the API without keys), and which route a request addresses behind a proxy."""

from __future__ import annotations

import ipaddress
from collections.abc import MutableMapping
from typing import Any


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def route_path(scope: MutableMapping[str, Any]) -> str:
    """The path the routes match: without the ``root_path`` a proxy mounts the app under (uvicorn's
    ``--root-path`` puts it in front of ``path``)."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
