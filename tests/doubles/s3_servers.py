"""moto S3 servers for storage-failure tests: one that stops and restarts on the same port, and
one (its own process) that checks credentials.

moto keeps its state per process, so the restartable server (a thread of the test process)
keeps its buckets across a restart; credential checks are a process-wide moto switch, so that
server runs in a subprocess and leaves the session's shared server alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from workers.tools.local_redis import free_port

REGION = "us-east-1"
ADMIN_KEY = "testing"  # moto's unchecked actions and the restartable server accept any key


def s3_client(url: str, key_id: str = ADMIN_KEY, secret: str = ADMIN_KEY) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
    )


class RestartableS3:
    """moto's threaded server on a fixed port of 127.0.0.1, stopped and started at will."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: Any = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer  # noqa: PLC0415 (dev-only dependency)

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    @property
    def running(self) -> bool:
        return self._server is not None


@dataclass(frozen=True)
class AuthS3:
    """A moto server that checks keys: `key_id`/`secret` may use every bucket, others may not."""

    url: str
    key_id: str
    secret: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=10)


# Unchecked requests before moto starts checking keys: create_user, create_access_key,
# put_user_policy, then one create_bucket per name in `buckets`.
_SETUP_ACTIONS = 3


def start_auth_s3(log_path: Path, buckets: tuple[str, ...]) -> AuthS3:
    """Start the server, create a user allowed s3:* and the buckets, then keys are checked."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT=str(_SETUP_ACTIONS + len(buckets)))
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    _wait_until_listening(url, process)
    iam = boto3.client(
        "iam",
        endpoint_url=url,
        region_name=REGION,
        aws_access_key_id=ADMIN_KEY,
        aws_secret_access_key=ADMIN_KEY,
    )
    iam.create_user(UserName="cosyq-worker")
    key = iam.create_access_key(UserName="cosyq-worker")["AccessKey"]
    allow = {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
    policy = json.dumps({"Version": "2012-10-17", "Statement": [allow]})
    iam.put_user_policy(UserName="cosyq-worker", PolicyName="s3", PolicyDocument=policy)
    for bucket in buckets:
        s3_client(url).create_bucket(Bucket=bucket)
    return AuthS3(url, key["AccessKeyId"], key["SecretAccessKey"], process)


def _wait_until_listening(url: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=1):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto server did not start within 30 s")
