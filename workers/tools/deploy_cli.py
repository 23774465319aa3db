"""`cosyq-worker deploy launchd|supervisord -n K`: supervisor configs for K worker slots."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from shared.errors import CosyqError, SettingsError
from shared.settings import load_settings
from workers.tools import deploy

EXIT_BAD_INPUT = 2


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "deploy",
        help="render supervisor configs (launchd agents, supervisord) for K worker slots",
        description="Render configs that run K `cosyq-worker run` processes with the current "
        "COSYQ_* settings, restart them whatever their exit status, and stop them warmly.",
    )
    kinds = parser.add_subparsers(dest="supervisor", required=True, metavar="SUPERVISOR")

    launchd = kinds.add_parser("launchd", help="macOS LaunchAgents, one label per slot")
    launchd.add_argument("-n", "--workers", type=int, required=True, help="number of slots K")
    launchd.add_argument("--label-prefix", default=deploy.DEFAULT_LABEL, help="label.<slot>")
    launchd.add_argument(
        "--out",
        type=Path,
        default=Path("~/Library/LaunchAgents"),
        help="where the plists go (default ~/Library/LaunchAgents)",
    )
    launchd.add_argument(
        "--log-dir",
        type=Path,
        default=Path("~/Library/Logs/cosyq"),
        help="worker logs (default ~/Library/Logs/cosyq)",
    )
    launchd.add_argument("--load", action="store_true", help="launchctl bootstrap each agent")
    launchd.add_argument(
        "--pool",
        action="store_true",
        help="one agent running `cosyq-worker pool -n K` instead of K agents",
    )
    launchd.set_defaults(handler=run_launchd)

    supervisord = kinds.add_parser("supervisord", help="one program with numprocs=K")
    supervisord.add_argument("-n", "--workers", type=int, required=True, help="number of K")
    supervisord.add_argument(
        "--out",
        type=Path,
        help="file to write, mode 0600 (default: stdout, refused when a setting is a secret)",
    )
    supervisord.add_argument(
        "--log-dir", type=Path, default=Path("logs"), help="worker logs (default ./logs)"
    )
    supervisord.set_defaults(handler=run_supervisord)


def _plan(args: argparse.Namespace) -> deploy.DeployPlan:
    settings = load_settings()  # refuses typos in COSYQ_* before they are baked into a config
    return deploy.DeployPlan.from_settings(settings, workers=args.workers, log_dir=args.log_dir)


def run_launchd(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
        paths = deploy.write_launchd(
            plan, args.out.expanduser(), label_prefix=args.label_prefix, pool=args.pool
        )
    except CosyqError as e:
        print(f"cosyq-worker deploy: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    for path in paths:
        print(path)
    if args.load:
        if sys.platform != "darwin":
            print("cosyq-worker deploy: --load needs macOS (launchctl)", file=sys.stderr)
            return EXIT_BAD_INPUT
        deploy.load_launchd(paths)
        print(f"loaded {len(paths)} agents; check with: launchctl list | grep {args.label_prefix}")
    return 0


def run_supervisord(args: argparse.Namespace) -> int:
    try:
        plan = _plan(args)
        text = deploy.render_supervisord(plan)
        secrets = deploy.secret_variables(plan.environment)
        if args.out is None and secrets:
            raise SettingsError(
                f"the config would hold the secrets of {', '.join(secrets)}: write it with "
                "--out FILE (mode 0600), never to the terminal"
            )
    except CosyqError as e:
        print(f"cosyq-worker deploy: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.out is None:
        sys.stdout.write(text)
    else:
        deploy.write_supervisord(plan, args.out)
        print(args.out)
    return 0
