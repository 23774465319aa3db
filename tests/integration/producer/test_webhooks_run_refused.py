"""`cosyq webhooks run` against a Redis that refuses its settings ends with one line and exit 2,
as the worker does, instead of retrying the refusal for ever as if Redis were away."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles.redis_servers import SecuredRedis, secured_redis

BIN = Path(sys.executable).parent
WEBHOOK_SECRET = "whsec_d2hzZWMtc2VjcmV0LTNaWg=="


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredRedis]:
    with secured_redis(tmp_path) as server:
        yield server


def test_a_wrong_redis_password_ends_the_dispatcher(secured: SecuredRedis, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env |= {"COSYQ_REDIS_URL": secured.url(password="wrong-pass-5TT")}
    env |= {"COSYQ_WEBHOOK_SECRET": WEBHOOK_SECRET}
    done = subprocess.run(
        [str(BIN / "cosyq"), "webhooks", "run"],
        check=False,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,  # before the fix it retried until killed
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 2, printed
    assert "Traceback" not in printed and "wrong-pass-5TT" not in printed, printed
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"cosyq: COSYQ_REDIS_URL (redis://:***@127.0.0.1:{secured.port}/0): authentication failed"
        )
    ), printed
