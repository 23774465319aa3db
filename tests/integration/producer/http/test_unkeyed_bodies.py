"""A request with a body to a keyed route, sent with no key or a wrong one, is answered 401 from
its headers: the front does not wait for the body first (the real front, uvicorn, raw sockets).
So is a /ui form posted with no valid session (the sign-in redirect), from another origin
(403), or from an address locked out (429, a right key's too).

Every route behind the key check read its body (up to COSYQ_HTTP_MAX_BODY_BYTES, 2 MB) before
its key was judged: a client without a key held a connection, and the memory of what it had
sent, for the whole read deadline by sending a body that never finished. Here 1 MB is declared
and 1 KB sent; the answer must come well inside the read deadline. A wrong key still counts
against the address (COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE). Each test speaks from loopback
addresses of its own (127.0.0.x), so no count of one reaches another.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import RedisServer
from tests.doubles.harness import named
from tests.integration.producer.http.conftest import Front, fresh_db, start_front

pytestmark = pytest.mark.slow

KEY = "unkeyed-key-" + "4" * 20
LIMIT = 3
READ_TIMEOUT_S = 60  # the default: an answer that waited for the body would take this long
PROMPT_S = 10  # well inside it
DECLARED = 1024 * 1024  # under the JSON cap: the old front waited for all of it
ROUTES = [
    ("POST", "/v1/jobs"),
    ("POST", "/v1/jobs:batch"),
    ("POST", "/v1/documents"),
    ("POST", "/v1/documents/0123abcd:retry"),
    ("DELETE", "/v1/documents/0123abcd"),
    ("DELETE", "/v1/jobs/0123abcd"),
    ("POST", "/v1/audio/speech"),
    ("POST", "/v1/audio/voices"),
]
ADDRESSES = (f"127.0.0.{n}" for n in itertools.count(20))
UI_POSTS = ["/ui/jobs/0123abcd/judge", "/ui/documents/0123abcd/retry", "/ui/signout"]
FORM_DECLARED = 2048  # under the /ui form cap (COSYQ_UI_MAX_FORM_BYTES, 4 KB)
FORM = "application/x-www-form-urlencoded"


@pytest.fixture(scope="module")
def front(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    started = start_front(
        tmp_path_factory.mktemp("http-unkeyed"),
        fresh_db(redis_server, "unkeyed"),
        COSYQ_API_KEYS=f"alpha:{KEY}",
        COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE=str(LIMIT),
        COSYQ_HTTP_REQUEST_READ_TIMEOUT_S=str(READ_TIMEOUT_S),
    )
    yield started
    started.stop()


def unfinished(
    front: Front,
    address: str,
    method: str,
    path: str,
    authorization: str,
    *,
    headers: str = "",
    declared: int = DECLARED,
    content_type: str = "application/json",
) -> bytes:
    """The first bytes answered to METHOD PATH whose body never finishes arriving (`headers`:
    more header lines, each ending in CRLF)."""
    host, port = front.url.removeprefix("http://").split(":")
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\ncontent-type: {content_type}\r\n"
        f"content-length: {declared}\r\n"
        + (f"authorization: {authorization}\r\n" if authorization else "")
        + headers
        + "\r\n"
    )
    with socket.create_connection(
        (host, int(port)), timeout=PROMPT_S, source_address=(address, 0)
    ) as client:
        client.sendall(head.encode() + b'{"text": "' + b"x" * 1024)
        return answer_of(client)


def answer_of(client: socket.socket) -> bytes:
    """The head and body of the one answer (Content-Length long) the client reads."""
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += client.recv(4096) or b"\r\n\r\n"  # a close ends the head too
    head, _, body = answer.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length and (more := client.recv(4096)):
        body += more
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("authorization", ["", "Bearer sk-not-a-key", "Basic c2stYWxwaGE="])
@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_a_body_without_a_key_is_answered_401_before_it_arrives(
    front: Front, method: str, path: str, authorization: str
) -> None:
    answer = unfinished(front, next(ADDRESSES), method, path, authorization)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"invalid_api_key" in answer
    assert named(front.events(), "http_internal_error") == []


def test_wrong_keys_with_unfinished_bodies_still_lock_the_address_out(front: Front) -> None:
    address = next(ADDRESSES)
    for method, path in ROUTES[:LIMIT]:
        answer = unfinished(front, address, method, path, "Bearer sk-not-a-key")
        assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    # the limit is full: the right key from that address is refused too, from its headers as
    # a wrong one is, and so is a /ui sign-in (its key is in the body: never read)
    for authorization in (f"Bearer {KEY}", "Bearer sk-not-a-key"):
        answer = unfinished(front, address, "POST", "/v1/jobs", authorization)
        assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        assert b"auth_failures_per_minute" in answer
    answer = unfinished(
        front, address, "POST", "/ui/signin", "", declared=FORM_DECLARED, content_type=FORM
    )
    assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
    assert unfinished(front, next(ADDRESSES), "POST", "/v1/jobs", "Bearer x").startswith(
        b"HTTP/1.1 401"
    )  # another address is not held back


def session_of(front: Front) -> str:
    """A /ui sign-in with the key: the `cosyq_ui=<id>` cookie it sets."""
    with httpx.Client(
        base_url=front.url, transport=httpx.HTTPTransport(local_address=next(ADDRESSES))
    ) as client:
        signed = client.post("/ui/signin", data={"key": KEY})
    assert signed.status_code == 303, signed.text
    return signed.headers["set-cookie"].split(";", 1)[0]


@pytest.mark.parametrize(
    ("authorization", "cookie", "answered"),
    [
        ("", "", b"303"),  # no session: to the sign-in form
        ("", "cosyq_ui=made-up-session", b"303"),
        ("Bearer sk-not-a-key", "", b"401"),
    ],
)
@pytest.mark.parametrize("path", UI_POSTS)
def test_a_ui_form_without_a_session_is_answered_before_its_body_arrives(
    front: Front, path: str, authorization: str, cookie: str, answered: bytes
) -> None:
    headers = f"cookie: {cookie}\r\n" if cookie else ""
    answer = unfinished(
        front, next(ADDRESSES), "POST", path, authorization, headers=headers, content_type=FORM
    )
    assert answer.startswith(b"HTTP/1.1 " + answered), answer[:200]
    if answered == b"303":
        assert b"location: /ui/signin" in answer.lower()
    assert named(front.events(), "http_internal_error") == []


@pytest.mark.parametrize("path", [*UI_POSTS, "/ui/signin"])
def test_a_ui_form_from_another_origin_is_answered_before_its_body_arrives(
    front: Front, path: str
) -> None:
    """Even with a valid session: the origin is judged from the headers too."""
    headers = f"cookie: {session_of(front)}\r\norigin: http://evil.example\r\n"
    answer = unfinished(
        front, next(ADDRESSES), "POST", path, "", headers=headers, content_type=FORM
    )
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"bad_origin" in answer


@pytest.mark.parametrize("path", ["/ui/signin", "/ui/signout", "/ui/jobs/0123abcd/judge"])
def test_a_ui_form_over_its_small_cap_is_413_at_once(front: Front, path: str) -> None:
    """A /ui form needs a few hundred bytes: one declared over COSYQ_UI_MAX_FORM_BYTES (not
    the JSON cap) is refused from its headers, a signed-in caller's too."""
    headers = f"cookie: {session_of(front)}\r\n"
    answer = unfinished(
        front,
        next(ADDRESSES),
        "POST",
        path,
        "",
        headers=headers,
        declared=FORM_DECLARED * 3,
        content_type=FORM,
    )
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"COSYQ_UI_MAX_FORM_BYTES" in answer
