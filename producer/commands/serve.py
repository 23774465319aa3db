"""`cosyq serve [--host 127.0.0.1] [--port 8000] [--workers N]`: the HTTP front, under uvicorn.

FastAPI and uvicorn come with the extra `cosyq[http]` and are imported only here, when the
command runs. Without COSYQ_API_KEYS the server binds loopback only.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from producer.http_bind import check_bind, check_port_free
from shared.connection import check_redis, redis_connection
from shared.errors import CosyqError, SettingsError, TransientError
from shared.eviction import warn_if_evicting
from shared.settings import Settings

if TYPE_CHECKING:
    from producer.cli import CliContext

FACTORY = "producer.http.app:app_from_environment"
HTTP_MODULES = ("fastapi", "uvicorn", "multipart")


def register(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve", help="the HTTP front: OpenAI-compatible /v1/audio/speech and a jobs API"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    serve.add_argument("--workers", type=int, default=1, help="server processes (default 1)")
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace, context: CliContext) -> int:
    missing = [name for name in HTTP_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise SettingsError(
            f"cosyq serve needs the http extra ({', '.join(missing)} missing): "
            "pip install 'cosyq[http]'"
        )
    if not 0 < args.port < 65536 or args.workers < 1:
        raise SettingsError(f"--port {args.port} / --workers {args.workers}: out of range")
    settings = context.settings
    check_bind(args.host, settings.api_key_list() + settings.operator_key_list())
    check_port_free(args.host, args.port)
    check_redis_settings(settings)
    import uvicorn  # noqa: PLC0415 (the http extra, only for this command)

    env_file = args.env_file if args.env_file and Path(args.env_file).is_file() else None
    try:
        _run_uvicorn(uvicorn, args, env_file, context.settings.http_request_read_timeout_s)
    except SystemExit as e:  # uvicorn's own start failure (its codes are not ours)
        if e.code in (0, None):
            return 0
        raise CosyqError("serve: the server did not start (its log above says why)") from e
    return 0


def check_redis_settings(settings: Settings) -> None:
    """Redis refusing these settings (password, ACL, a user without write permission, TLS
    certificate, another service on that port) is a setting to fix: exit 2 now, not a server
    whose every request fails. Redis away is not: the front starts and /readyz says so until it
    is back."""
    connection = redis_connection(settings)
    try:
        check_redis(connection, settings)  # a user without write permission (NOPERM) too
        warn_if_evicting(connection, "serve")
    except (TransientError, redis.RedisError):
        pass  # away (or erring otherwise): the front starts, /readyz says why
    finally:
        connection.close()


def _run_uvicorn(
    uvicorn: Any, args: argparse.Namespace, env_file: str | None, read_s: float
) -> None:
    from producer.http.read_deadline import ReadDeadlineProtocol  # noqa: PLC0415 (http extra)

    uvicorn.run(
        FACTORY,
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        env_file=env_file,
        log_config=None,  # our structlog setup (configured by the factory)
        access_log=False,  # our one line per request (middleware.AccessLog)
        server_header=False,
        http=functools.partial(ReadDeadlineProtocol, read_timeout_s=read_s),
    )
