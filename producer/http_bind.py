"""Where `cosyq serve` may listen: without API keys, loopback only (anyone else could enqueue).

Kept out of producer/http/ so the check runs, and is tested, without FastAPI installed.
"""

from __future__ import annotations

import ipaddress

from shared.errors import SettingsError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys: tuple[str, ...]) -> None:
    """Without API keys the server may listen on loopback only (anyone else could enqueue)."""
    if not keys and not is_loopback(host):
        raise SettingsError(
            f"--host {host}: without COSYQ_API_KEYS the HTTP front binds only loopback "
            "(127.0.0.1, ::1, localhost); set keys to listen on other addresses"
        )
