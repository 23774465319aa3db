"""`cosyq webhooks run` (a dispatcher until SIGTERM/SIGINT), `cosyq webhooks failed
[--redeliver] [WEBHOOK_ID ...]` (the dead letters, and sending them again) and `cosyq webhooks
secret TENANT` (the secret that tenant's receivers verify with, for the operator to hand out)."""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from rich.table import Table

from shared.console import cell
from shared.errors import SettingsError, UnknownTenantError
from shared.plurals import counted
from shared.settings_env import redact_url

if TYPE_CHECKING:
    from producer.cli import CliContext


def register(subparsers: Any) -> None:
    group = subparsers.add_parser("webhooks", help="deliver webhooks; list and resend dead ones")
    commands = group.add_subparsers(dest="webhooks_command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="deliver the outbox until stopped (SIGTERM, Ctrl-C)")
    run.set_defaults(handler=run_dispatcher)
    failed = commands.add_parser("failed", help="webhooks given up on, and why")
    failed.add_argument("webhook_ids", nargs="*", help="only these (default: all)")
    failed.add_argument("--redeliver", action="store_true", help="queue them for delivery again")
    failed.set_defaults(handler=run_failed)
    secret = commands.add_parser("secret", help="the secret a tenant's receivers verify with")
    secret.add_argument("tenant", help="a tenant of COSYQ_API_KEYS or COSYQ_TENANTS")
    secret.set_defaults(handler=print_secret)


def run_dispatcher(args: argparse.Namespace, context: CliContext) -> int:
    from producer.webhooks.dispatcher import WebhookDispatcher  # noqa: PLC0415 (httpx)

    with context.make_client(context.settings) as client:
        dispatcher = WebhookDispatcher(client.connection, context.settings)
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        context.err.print("delivering webhooks (Ctrl-C stops)", markup=False)
        dispatcher.run(stop)
    return 0


def print_secret(args: argparse.Namespace, context: CliContext) -> int:
    """Print the tenant's signing secret (derived from COSYQ_WEBHOOK_SECRET; never logged)."""
    from shared.webhooks import tenant_secret  # noqa: PLC0415

    settings = context.settings
    if settings.webhook_secret is None:
        raise SettingsError("COSYQ_WEBHOOK_SECRET: required to sign webhooks (whsec_...)")
    if args.tenant not in settings.tenant_names():
        raise UnknownTenantError(
            f"unknown tenant {args.tenant!r}: a tenant of COSYQ_API_KEYS or COSYQ_TENANTS"
        )
    secret = tenant_secret(settings.webhook_secret.get_secret_value(), args.tenant)
    context.out.print(secret, markup=False)
    return 0


def run_failed(args: argparse.Namespace, context: CliContext) -> int:
    from producer.webhooks.store import WebhookStore  # noqa: PLC0415

    with context.make_client(context.settings) as client:
        store = WebhookStore(client.connection)
        dead = store.dead_letters()
        wanted = set(args.webhook_ids) or set(dead)
        missing = sorted(wanted - set(dead))
        chosen = {key: json.loads(dead[key]) for key in sorted(wanted & set(dead))}
        if args.redeliver:
            sent = sum(store.redeliver(key, _fresh(record)) for key, record in chosen.items())
            context.out.print(f"queued {counted(sent, 'webhook')} for delivery again", markup=False)
        else:
            _print_dead(context, chosen)
    for key in missing:
        context.err.print(f"{key}: not among the dead webhooks", markup=False)
    return 1 if missing else 0


def _fresh(record: dict[str, Any]) -> str:
    """The delivery as a new one: tries and the retry window start again."""
    keep = {k: record[k] for k in ("event", "body") if k in record}
    return json.dumps({**keep, "tries": 0, "first_try_at": time.time(), "last_error": ""})


def _print_dead(context: CliContext, records: dict[str, dict[str, Any]]) -> None:
    table = Table(title=f"dead webhooks ({len(records)})")
    for name in ("webhook id", "event", "job", "url", "tries", "why"):
        table.add_column(name, overflow="fold")
    for key, record in records.items():
        event = record.get("event") or record.get("fields") or {}
        url = redact_url(str(event.get("url", "")), keep_user=False, keep_query=False)
        cells = (event.get("event"), event.get("job_id"), url, record.get("tries"))
        why = record.get("dead_reason") or record.get("error")
        table.add_row(cell(key), *(cell(c) for c in (*cells, why)))
    context.out.print(table)
