"""redis-servers with security on, started by a test: requirepass + ACL users, and TLS.

Each is our own process on a free port of 127.0.0.1 with persistence off, stopped afterwards.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from redis.backoff import NoBackoff
from redis.retry import Retry

ADMIN_PASSWORD = "admin pass"  # the default user's requirepass
# name -> (password, ACL rules): a full user, and one that may only read
ACL_USERS = {
    "alice": ("s3cret pass", ("~*", "&*", "+@all")),
    "reader": ("reader pass", ("~*", "&*", "-@all", "+@read", "+@connection")),
}
START_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SecuredRedis:
    port: int

    def url(self, user: str = "", password: str = "", db: int = 0) -> str:
        """A URL for `user:password` (password URL-quoted; empty user: the default user)."""
        quoted = password.replace(" ", "%20")
        userinfo = f"{user}:{quoted}@" if password else (f"{user}@" if user else "")
        return f"redis://{userinfo}127.0.0.1:{self.port}/{db}"

    def admin(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=ADMIN_PASSWORD)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def secured_redis(workdir: Path) -> Iterator[SecuredRedis]:
    """A redis-server with requirepass and the ACL_USERS."""
    port = free_port()
    args = [_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--requirepass", ADMIN_PASSWORD, "--dir", str(workdir)]
    with _running(args):
        server = SecuredRedis(port)
        admin = redis.Redis(
            host="127.0.0.1", port=port, password=ADMIN_PASSWORD, retry=Retry(NoBackoff(), 0)
        )
        _wait_until_answering(admin)
        for name, (password, rules) in ACL_USERS.items():
            admin.execute_command("ACL", "SETUSER", name, "on", f">{password}", *rules)
        admin.close()
        yield server


@contextmanager
def tls_redis(workdir: Path) -> Iterator[tuple[int, Path]]:
    """A TLS-only redis-server with a self-signed certificate and requirepass `tlspass`."""
    cert, key = self_signed(workdir)
    port = free_port()
    args = [_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"]
    args += ["--save", "", "--appendonly", "no", "--dir", str(workdir)]
    args += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    args += ["--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
    args += ["--requirepass", "tlspass"]
    with _running(args):
        client = redis.Redis(
            host="127.0.0.1",
            port=port,
            ssl=True,
            ssl_ca_certs=str(cert),
            password="tlspass",
            retry=Retry(NoBackoff(), 0),
        )
        _wait_until_answering(client, what="TLS redis-server (built without TLS?)")
        client.close()
        yield port, cert


def self_signed(folder: Path, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed CA certificate for `host` (an address or a name) and its key, as PEM files
    in `folder`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    try:
        alt_name: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        alt_name = x509.DNSName(host)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([alt_name]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def _binary() -> str:
    return shutil.which("redis-server") or "redis-server"


@contextmanager
def _running(args: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        process.terminate()
        process.wait(timeout=10)


def _wait_until_answering(client: redis.Redis, what: str = "redis-server") -> None:
    """Poll until PING answers (the client is built without retries: we poll here)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} did not start") from None
            time.sleep(0.05)
