"""Redis connections from settings: ACL users and passwords in the URL, and rediss:// (TLS)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from redis.backoff import NoBackoff
from redis.retry import Retry

from shared.connection import check_redis, redis_connection
from shared.errors import SettingsError, TransientError
from shared.settings import load_settings


@pytest.fixture
def acl_user(redis_url: str) -> Iterator[tuple[str, str]]:
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", "alice", "on", ">s3cret pass", "~*", "&*", "+@all")
    yield "alice", "s3cret pass"
    admin.execute_command("ACL", "DELUSER", "alice")
    admin.close()


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def test_acl_user_and_password_in_the_url(redis_url: str, acl_user: tuple[str, str]) -> None:
    url = f"redis://alice:s3cret%20pass@127.0.0.1:{port_of(redis_url)}/3"
    settings = load_settings(env_file=None, redis_url=url)
    connection = redis_connection(settings)
    check_redis(connection, settings)
    assert connection.acl_whoami() == "alice"
    assert connection.connection_pool.connection_kwargs["db"] == 3
    connection.close()


def test_wrong_password_is_a_settings_error_without_the_password(
    redis_url: str, acl_user: tuple[str, str]
) -> None:
    url = f"redis://alice:wrong@127.0.0.1:{port_of(redis_url)}/0"
    settings = load_settings(env_file=None, redis_url=url)
    with pytest.raises(SettingsError) as caught:
        check_redis(redis_connection(settings), settings)
    assert "redis://alice:***@127.0.0.1" in str(caught.value)
    assert "wrong" not in str(caught.value)


def test_unreachable_redis_is_transient() -> None:
    settings = load_settings(env_file=None, redis_url="redis://127.0.0.1:9/0")
    with pytest.raises(TransientError, match=r"cannot reach Redis at redis://127\.0\.0\.1:9/0"):
        check_redis(redis_connection(settings), settings)


def self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
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
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
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


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    """A TLS-only redis-server of our own, with a requirepass, on a free port."""
    cert, key = self_signed(tmp_path)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    args = [shutil.which("redis-server") or "redis-server", "--port", "0"]
    args += ["--tls-port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    args += ["--tls-cert-file", str(cert), "--tls-key-file", str(key)]
    args += ["--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
    args += ["--requirepass", "tlspass", "--dir", str(tmp_path)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(
            host="127.0.0.1",
            port=port,
            ssl=True,
            ssl_ca_certs=str(cert),
            retry=Retry(NoBackoff(), 0),  # we poll here ourselves
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.AuthenticationError:
                break  # TLS works; it just wants the password
            except redis.ConnectionError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("TLS redis-server did not start (built without TLS?)")
                time.sleep(0.05)
        client.close()
        yield port, cert
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_rediss_url_with_password_and_private_ca(tls_redis: tuple[int, Path]) -> None:
    port, cert = tls_redis
    settings = load_settings(
        env_file=None,
        redis_url=f"rediss://default:tlspass@127.0.0.1:{port}/0",
        redis_ssl_ca_certs=cert,
    )
    connection = redis_connection(settings)
    check_redis(connection, settings)
    connection.set("k", b"v")
    assert connection.get("k") == b"v"
    assert type(connection.connection_pool.get_connection()).__name__ == "SSLConnection"
    connection.close()
