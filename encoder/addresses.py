"""Whether a listening address is reachable from this machine only (the services refuse to run open
on any other address: the encoder without its key, the API without keys)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
