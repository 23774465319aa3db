"""Where `cosyq serve` may listen: without API keys, loopback only (anyone else could enqueue).

Kept out of producer/http/ so the check runs, and is tested, without FastAPI installed.
"""

from __future__ import annotations

import ipaddress
import socket

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


def check_port_free(host: str, port: int) -> None:
    """Bind (host, port) once, as uvicorn will (SO_REUSEADDR): a port in use, or an address
    this machine does not have, is one clear SettingsError before the server starts."""
    address = host.strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError as e:
            raise SettingsError(
                f"--host {host} --port {port}: cannot listen there ({e.strerror or e}; "
                "another server on that port?)"
            ) from e
