"""`cosyq webhooks run` and `cosyq serve` against a Redis that refuses their settings end with
one line and exit 2, as the worker does: the dispatcher used to retry the refusal for ever as if
Redis were away, and serve to start a server whose every request failed."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles.redis_servers import ACL_USERS, SecuredRedis, free_port, secured_redis

BIN = Path(sys.executable).parent
WEBHOOK_SECRET = "whsec_d2hzZWMtc2VjcmV0LTNaWg=="


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredRedis]:
    with secured_redis(tmp_path) as server:
        yield server


@pytest.mark.parametrize(
    "argv", [["webhooks", "run"], ["serve", "--port", str(free_port())]], ids=["webhooks", "serve"]
)
def test_a_wrong_redis_password_ends_the_command(
    argv: list[str], secured: SecuredRedis, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env |= {"COSYQ_REDIS_URL": secured.url(password="wrong-pass-5TT")}
    env |= {"COSYQ_WEBHOOK_SECRET": WEBHOOK_SECRET}
    done = subprocess.run(
        [str(BIN / "cosyq"), *argv],
        check=False,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,  # before the fix both ran until killed
    )
    printed = done.stdout + done.stderr
    url = f"redis://:***@127.0.0.1:{secured.port}/0"
    assert done.returncode == 2, printed
    assert "Traceback" not in printed and "wrong-pass-5TT" not in printed, printed
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"cosyq: COSYQ_REDIS_URL ({url}): authentication failed"), printed


def test_serve_with_a_user_redis_lets_read_only_ends_at_once(
    secured: SecuredRedis, tmp_path: Path
) -> None:
    # PING passes for such a user; every submit would then fail with NOPERM
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env |= {"COSYQ_REDIS_URL": secured.url("reader", ACL_USERS["reader"][0])}
    done = subprocess.run(
        [str(BIN / "cosyq"), "serve", "--port", str(free_port())],
        check=False,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 2, printed
    assert "Traceback" not in printed and ACL_USERS["reader"][0] not in printed, printed
    assert "permission denied (ACL)" in done.stderr.strip().splitlines()[-1], printed
