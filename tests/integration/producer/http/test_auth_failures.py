"""Wrong keys per client address (COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE) over real HTTP: two
`cosyq serve` processes on one Redis (no worker: nothing here submits a job), a limit of 3.

Each test speaks from its own loopback address (127.0.0.x: Linux routes the whole 127/8 to
`lo`), so each starts with an empty window and none waits for another's minute to pass.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import RedisServer
from tests.doubles.harness import named
from tests.integration.producer.http.conftest import Front, fresh_db, start_front

KEY, OPERATOR = "auth-key-" + "5" * 20, "auth-operator-" + "6" * 20
LIMIT = 3


@pytest.fixture(scope="module")
def fronts(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Front, Front]]:
    root = tmp_path_factory.mktemp("http-auth")
    url = fresh_db(redis_server, "auth")
    settings = {
        "COSYQ_API_KEYS": f"alpha:{KEY}",
        "COSYQ_OPERATOR_KEYS": OPERATOR,
        "COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE": str(LIMIT),
    }
    first = start_front(root / "first", url, **settings)
    try:
        second = start_front(root / "second", url, **settings)
    except BaseException:
        first.stop()
        raise
    try:
        yield first, second
    finally:
        first.stop()
        second.stop()


def _from(front: Front, address: str, key: str | None = None) -> httpx.Client:
    """A client whose connections leave from `address`, the front's peer address for them."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=front.url, headers=headers, transport=transport, timeout=30.0)


def _locked_out(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert 1 <= int(response.headers["retry-after"]) <= 60
    error = response.json()["error"]
    assert error["type"] == "rate_limit_error"
    assert error["code"] == "auth_failures_per_minute"
    assert "COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE" in error["message"]


def test_wrong_keys_lock_the_address_out_on_every_front_even_for_the_right_key(
    fronts: tuple[Front, Front],
) -> None:
    first, second = fronts
    address = "127.0.0.2"
    with _from(first, address, "wrong-1") as wrong, _from(second, address, "wrong-2") as other:
        # a forged X-Forwarded-For from a peer uvicorn does not trust changes nothing
        spoofed = {"X-Forwarded-For": "203.0.113.9"}
        assert wrong.get("/v1/audio/voices", headers=spoofed).status_code == 401
        assert other.get("/metrics").status_code == 401  # the other front counts in the same window
        assert wrong.get("/ui").status_code == 401  # the limit fills here: locked out
        _locked_out(wrong.get("/v1/jobs/0123abcd"))  # no more keys judged from this address
    for front in fronts:
        with _from(front, address, KEY) as right, _from(front, address, OPERATOR) as operator:
            _locked_out(right.get("/v1/audio/voices"))
            _locked_out(operator.get("/v1/audio/voices"))
    with _from(first, "127.0.0.3", KEY) as elsewhere:  # another address is not held back
        assert elsewhere.get("/v1/audio/voices").status_code == 200
    lockouts = named(first.events() + second.events(), "http_auth_locked_out")
    assert len(lockouts) == 1
    assert lockouts[0]["client"] == address and lockouts[0]["failures_per_minute"] == LIMIT
    logged = first.log.read_text() + second.log.read_text()
    assert "wrong-1" not in logged and "wrong-2" not in logged and KEY not in logged


def test_failed_ui_sign_ins_count_and_a_locked_address_cannot_sign_in(
    fronts: tuple[Front, Front],
) -> None:
    first, _ = fronts
    with _from(first, "127.0.0.4") as browser:
        for attempt in range(LIMIT):
            signed = browser.post("/ui/signin", data={"key": f"guess-{attempt}"})
            assert signed.status_code == 401
            assert "unknown key" in signed.text
        signed = browser.post("/ui/signin", data={"key": KEY})
        _locked_out(signed)
        assert "set-cookie" not in signed.headers  # no session opened


def test_requests_without_a_key_are_not_guesses(fronts: tuple[Front, Front]) -> None:
    first, _ = fronts
    with _from(first, "127.0.0.5") as anonymous:
        for _ in range(LIMIT + 2):
            assert anonymous.get("/v1/audio/voices").status_code == 401
            assert anonymous.get("/metrics").status_code == 200  # a keyless scrape
    with _from(first, "127.0.0.5", KEY) as right:
        assert right.get("/v1/audio/voices").status_code == 200
