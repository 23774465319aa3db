"""A worker or pool that Redis refuses (wrong password, unknown user, NOPERM, a TLS certificate
that does not verify) exits non-zero at once with one line; an unreachable Redis is waited out."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.doubles.harness import BEFORE_ANY_BATCH, Cluster, named, wait_for
from tests.doubles.redis_servers import ACL_USERS, secured_redis, tls_redis

# Workers start with exec, as a supervisor starts them: a configuration error ends a fresh
# process with one line.
pytestmark = pytest.mark.worker_exec

CONNECT_TIMEOUT_S = 5.0


def refusal_lines(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [line for line in lines if line.startswith("cosyq-worker")]


@BEFORE_ANY_BATCH
@pytest.mark.timeout(300)  # five interpreters at once: slow on a loaded machine
def test_refused_worker_exits_2_with_one_line_never_waiting(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "plain").mkdir()
    (tmp_path / "tls").mkdir()
    with secured_redis(tmp_path / "plain") as server, tls_redis(tmp_path / "tls") as (tls, _):
        reader_password, _ = ACL_USERS["reader"]
        cases = {
            "wrong-password": (server.url(password="not it"), "authentication failed"),
            "unknown-user": (server.url("nobody", "not it"), "authentication failed"),
            "noperm": (server.url("reader", reader_password), "permission denied (ACL)"),
            "tls": (f"rediss://default:tlspass@127.0.0.1:{tls}/0", "TLS certificate did not"),
        }
        workers = {
            name: cluster.start(
                "run",
                log_name=f"{name}.log",
                COSYQ_REDIS_URL=url,
                COSYQ_REDIS_CONNECT_TIMEOUT_S=str(CONNECT_TIMEOUT_S),
            )
            for name, (url, _) in cases.items()
        }
        unreachable = cluster.start(
            "run", log_name="down.log", COSYQ_REDIS_URL="redis://127.0.0.1:9/0"
        )
        for name, worker in workers.items():
            assert worker.wait(timeout=60) == 2, name
        # each ended on its own (an outage would be waited out for ever) and never waited: no
        # bound in seconds, which a loaded machine's interpreter start-ups would make flaky
        for name, (url, cause) in cases.items():
            (line,) = refusal_lines(tmp_path / f"{name}.log")
            masked = url.split("@")[0].rsplit(":", 1)[0] + ":***@127.0.0.1:"
            assert line.startswith(f"cosyq-worker: COSYQ_REDIS_URL ({masked}"), line
            assert cause in line and "not it" not in line and "tlspass" not in line
            assert not named(cluster.events(f"{name}.log"), "waiting_for_redis"), name
        # A Redis that is not there is an outage: that worker waits for it (its interpreter may
        # still be starting when the refused ones have ended: waited for, not assumed).
        waiting = lambda: named(cluster.events("down.log"), "waiting_for_redis")  # noqa: E731
        wait_for(waiting, 60, "the worker of the unreachable Redis to wait for it")
        assert unreachable.poll() is None
        unreachable.terminate()
        unreachable.wait(timeout=30)


@pytest.mark.timeout(300)
def test_pool_refuses_to_start_and_backs_off_slots_redis_turns_away(
    cluster: Cluster, tmp_path: Path
) -> None:
    with secured_redis(tmp_path) as server:
        pool = cluster.start("pool", "-n", "1", log_name="bad.log", COSYQ_REDIS_URL=server.url())
        assert pool.wait(timeout=60) == 2
        (line,) = refusal_lines(tmp_path / "bad.log")
        assert "authentication failed: Authentication required" in line

        password, _ = ACL_USERS["alice"]
        cluster.overrides["COSYQ_REDIS_URL"] = server.url("alice", password)
        pool = cluster.start(
            "pool", "-n", "1", "--backoff-initial", "0.2", "--backoff-max", "0.4", log_name="p.log"
        )
        wait_for(lambda: named(cluster.events("p.log"), "slot_ready"), 60, "a ready slot")
        admin = server.admin()
        admin.execute_command("ACL", "SETUSER", "alice", "resetpass", ">changed")
        admin.execute_command("CLIENT", "KILL", "USER", "alice")  # every connection logs in again
        wait_for(lambda: len(named(cluster.events("p.log"), "slot_crashed")) >= 3, 60, "crashes")
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(timeout=30) == 0
        admin.close()
    events = cluster.events("p.log")
    crashes = named(events, "slot_crashed")
    assert [e["backoff_s"] for e in crashes[:3]] == [0.2, 0.4, 0.4]
    assert all("authentication failed" in e["reason"] for e in crashes)
    assert all(e["how"] == "exit code 2" for e in crashes)
    refused = named(events, "redis_refused_worker")
    assert refused and all("redis://alice:***@" in e["error"] for e in refused)
