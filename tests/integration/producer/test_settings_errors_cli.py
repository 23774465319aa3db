"""Every entry point refuses a bad setting in one line with none of the secrets in it, as the
real console scripts run (issue 44 item 7: a rule across fields printed the whole input)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
SECRETS = {
    "COSYQ_REDIS_URL": "redis://alice:redis-pass-7Q2@127.0.0.1:1/0",
    "COSYQ_S3_ACCESS_KEY_ID": "AKIA-ID-9KX",
    "COSYQ_S3_SECRET_ACCESS_KEY": "s3-secret-4RT",
    "COSYQ_API_KEYS": "alpha:alpha-key-1MN,beta:beta-key-8PL",
    "COSYQ_WEBHOOK_SECRET": "whsec_d2hzZWMtc2VjcmV0LTNaWg==",  # base64 of whsec-secret-3ZZ
}
SECRET_PARTS = ("redis-pass-7Q2", "AKIA-ID-9KX", "s3-secret-4RT", "alpha-key-1MN", "beta-key-8PL")
BROKEN_RULES = {
    "heartbeat": {"COSYQ_HEARTBEAT_INTERVAL_S": "10", "COSYQ_HEARTBEAT_TTL_S": "5"},
    "webhook claim": {"COSYQ_WEBHOOK_TIMEOUT_S": "10", "COSYQ_WEBHOOK_CLAIM_IDLE_S": "10"},
    "a field": {"COSYQ_MAX_JOBS": "many"},
    "a storage URL": {"COSYQ_STORAGE_URL": "https://key:storage-pass-6VV@bucket/prefix"},
    "a Redis URL urlsplit refuses": {"COSYQ_REDIS_URL": "redis://alice:redis-pass-7Q2@[::1/0"},
    "a signing secret not base64": {"COSYQ_WEBHOOK_SECRET": "whsec_\u00c4signing-8TT"},
    # reached socket.settimeout as an OverflowError traceback (shared/settings_bounds.py)
    "a timeout past its ceiling": {"COSYQ_REDIS_CONNECT_TIMEOUT_S": "1e300"},
    # read as the current folder (shared/settings_paths.py)
    "an empty model folder": {"COSYQ_MODEL_DIR": ""},
    # a bare FileExistsError once the worker's model had loaded
    "a cache folder that is a file": {"COSYQ_HASH_CACHE_DIR": "/dev/null"},
}
COMMANDS = {
    "cosyq status": ["cosyq", "status"],
    "cosyq webhooks run": ["cosyq", "webhooks", "run"],
    "cosyq serve": ["cosyq", "serve", "--port", "0"],
    "cosyq-worker run": ["cosyq-worker", "run"],
    "cosyq-worker bench queue": ["cosyq-worker", "bench", "queue"],
}


@pytest.mark.parametrize("rule", sorted(BROKEN_RULES))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_refused_setting_prints_no_secret(command: str, rule: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env |= SECRETS | BROKEN_RULES[rule]
    argv = COMMANDS[command]
    done = subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        check=False,
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    printed = done.stdout + done.stderr
    assert done.returncode != 0, printed
    assert "Traceback" not in printed and "invalid settings" in done.stderr, printed
    assert len(done.stderr.strip().splitlines()) == 1, printed
    for secret in (*SECRET_PARTS, "d2hzZWMtc2VjcmV0LTNaWg", "storage-pass-6VV", "signing-8TT"):
        assert secret not in printed, (secret, printed)
