"""What a hostile tenant (or any client) writes that an operator later reads, against the real
front (`cosyq serve`, uvicorn) logging in the console format: a URL path with terminal escape
sequences in the access log, and markup in a job's or a document's text on the /ui pages.
Nothing written is obeyed: the log shows escapes, the pages show text (autoescaped, and a CSP
that runs no inline script in case one ever is not)."""

from __future__ import annotations

import html
from collections.abc import Iterator

import pytest

from tests.conftest import RedisServer
from tests.doubles.harness import wait_for
from tests.integration.producer.http.conftest import Front, fresh_db, start_front

pytestmark = pytest.mark.slow

# Clear the screen, set the clipboard (OSC 52), a hidden link (OSC 8) and a bidi override; no
# space, quote or "=" (structlog's console quotes a value with one, escaping it by chance).
ESCAPES = "\x1b[2J\x1b]52;c;cHduZWQ\x1b\\\x1b]8;;https://evil.example/\x1b\\here\u202e"
MARKUP = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)> --> &amp;"
# What a text may hold of it (an element is refused at submission: shared/text_markup.py).
TEXT = 'He said "\'> onmouseover=alert(3) x=" & left --> right.'


@pytest.fixture(scope="module")
def front(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """No worker; the console log format, as an operator at a terminal runs it."""
    root = tmp_path_factory.mktemp("http-readback")
    started = start_front(root, fresh_db(redis_server, "readback"), COSYQ_LOG_FORMAT="console")
    yield started
    started.stop()


def test_a_path_with_terminal_escapes_is_logged_escaped(front: Front) -> None:
    """uvicorn hands the route its path percent-decoded: ESC, OSC 52's clipboard write and a
    newline that would start a forged line reach the access log line as escapes."""
    with front.http() as http:
        for path in (ESCAPES, "x\r\n2026 [info] forged"):
            quoted = "".join(f"%{b:02x}" for b in path.encode())
            assert http.get(f"/v1/jobs/{quoted}").status_code in (400, 404)

    def logged() -> str:
        return front.log.read_text(encoding="utf-8")

    wait_for(lambda: "cHduZWQ" in logged() and "forged" in logged(), 10, "both access lines")
    text = logged()
    for control in ("\x1b", "\u202e", "\r"):
        assert control not in text
    assert "\\u001b]52;c;cHduZWQ\\u001b" in text and "\\u202e" in text
    assert not any(line.startswith("2026 [info] forged") for line in text.splitlines())


def test_ui_pages_show_a_tenants_markup_as_text(front: Front) -> None:
    with front.http() as http:
        job = http.post("/v1/jobs", json={"text": TEXT, "metadata": {"note": MARKUP}})
        assert job.status_code == 202, job.text
        document = http.post("/v1/documents", json={"text": f"{TEXT}\n\nTwo."})
        assert document.status_code == 202, document.text
        pages = [
            http.get(f"/ui/jobs/{job.json()['id']}"),
            http.get(f"/ui/documents/{document.json()['id']}"),
            http.get("/ui/jobs", params={"voice": MARKUP}),  # the filter echoes it back
        ]
    for page, shown in zip(pages, (TEXT, TEXT, MARKUP), strict=True):
        assert page.status_code == 200, page.text
        assert "<script>alert" not in page.text and "<img src=x" not in page.text
        assert "\"'> onmouseover" not in page.text
        assert _escaped(shown) in page.text
        policy = page.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert page.headers["x-content-type-options"] == "nosniff"


def _escaped(text: str) -> str:
    """`text` as Jinja2's autoescape writes it (markupsafe: &#34; and &#39; for quotes)."""
    return html.escape(text, quote=False).replace('"', "&#34;").replace("'", "&#39;")
