"""The operator's page (/ui, issue 49) in a real headless browser (Debian's chromium, driven by
selenium) against a real `cosyq serve`, Redis and a worker on the tiny model whose quality
check calls every result too short (COSYQ_QUALITY_MIN_LENGTH_RATIO far above 1): every result
is suspect, and accepted as the default COSYQ_QUALITY_ON_SUSPECT says.

Two tenants (acme, beta) and an operator key. Each test makes the jobs it looks at; none relies
on another's order.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from shared import keys
from shared.document_state import document_key
from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, wait_for
from tests.integration.producer.http.conftest import Front, fresh_db, start_front, start_tiny_pool

ACME, BETA = "acme-key-" + "1" * 24, "beta-key-" + "2" * 24
OPERATOR = "operator-key-" + "3" * 20
DONE_TIMEOUT_S = 180.0
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian's chromium and chromium-driver (.ci/run installs them)",
)


@pytest.fixture(scope="module")
def front(
    redis_server: RedisServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    root = tmp_path_factory.mktemp("http-ui")
    front = start_front(
        root / "front",
        fresh_db(redis_server, "ui"),
        COSYQ_API_KEYS=f"acme:{ACME},beta:{BETA}",
        COSYQ_OPERATOR_KEYS=OPERATOR,
        COSYQ_DOCUMENT_SEGMENT_CHARS="50",  # a two-sentence document is two segments
    )
    cluster = start_tiny_pool(
        root,
        front,
        tiny_model_dir,
        COSYQ_TENANTS="acme,beta",
        COSYQ_QUALITY_MIN_LENGTH_RATIO="1000",
        COSYQ_QUALITY_MIN_EXPECTED_S="0",
    )
    try:
        yield front
    finally:
        front.stop()
        cluster.stop_all()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    from selenium import webdriver  # noqa: PLC0415 (only where the browser tests run)

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1280,800",
        "--autoplay-policy=no-user-gesture-required",
        "--mute-audio",
    ):
        options.add_argument(argument)
    service = webdriver.ChromeService(executable_path=str(CHROMEDRIVER))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def _local(front: Front) -> str:
    """The front as `localhost`: a secure context, so the Secure cookie is kept over http."""
    return front.url.replace("127.0.0.1", "localhost")


def sign_in(driver: object, front: Front, key: str, name: str = "") -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    driver.delete_all_cookies()  # type: ignore[attr-defined]
    driver.get(_local(front) + "/ui/signin")  # type: ignore[attr-defined]
    driver.find_element(By.ID, "key").send_keys(key)  # type: ignore[attr-defined]
    driver.find_element(By.ID, "name").send_keys(name)  # type: ignore[attr-defined]
    driver.find_element(By.ID, "signin").click()  # type: ignore[attr-defined]
    wait_for(lambda: driver.current_url.endswith("/ui"), 20, "the fleet page after sign-in")  # type: ignore[attr-defined]


def submit(front: Front, key: str, text: str) -> str:
    with front.http(key) as http:
        answer = http.post("/v1/jobs", json={"text": text})
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])


def wait_done(front: Front, key: str, job_id: str) -> None:
    with front.http(key) as http:
        wait_for(
            lambda: http.get(f"/v1/jobs/{job_id}").json().get("state") in ("finished", "failed"),
            DONE_TIMEOUT_S,
            f"job {job_id} to end",
            interval=0.3,
        )


def connection(front: Front) -> redis.Redis:
    return redis.Redis.from_url(front.redis_url)


def test_a_tenant_sees_only_its_own_jobs_and_an_operator_all(front: Front, browser: object) -> None:
    ours, theirs = submit(front, ACME, "Ours to see."), submit(front, BETA, "Theirs alone.")
    sign_in(browser, front, ACME)
    browser.get(_local(front) + "/ui/jobs")  # type: ignore[attr-defined]
    page = browser.page_source  # type: ignore[attr-defined]
    assert ours in page and theirs not in page
    assert ACME not in page  # the key is never in a page
    cookies = browser.get_cookies()  # type: ignore[attr-defined]
    assert [c["name"] for c in cookies] == ["cosyq_ui"]
    assert cookies[0]["httpOnly"] and cookies[0]["secure"] and cookies[0]["sameSite"] == "Strict"
    assert ACME not in cookies[0]["value"]

    browser.get(_local(front) + f"/ui/jobs/{theirs}")  # type: ignore[attr-defined]
    assert "Theirs alone" not in browser.page_source and "no job" in browser.page_source  # type: ignore[attr-defined]

    sign_in(browser, front, OPERATOR)
    browser.get(_local(front) + "/ui/jobs")  # type: ignore[attr-defined]
    assert ours in browser.page_source and theirs in browser.page_source  # type: ignore[attr-defined]


def _judge_by_key(browser: object, key: str) -> str:
    """On a job page in the judging queue: the job's id, then press `key`."""
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    job_id = browser.find_element(By.ID, "job-id").text  # type: ignore[attr-defined]
    browser.find_element(By.TAG_NAME, "body").send_keys(key)  # type: ignore[attr-defined]
    wait_for(lambda: job_id not in browser.current_url, 20, "the next page after judging")  # type: ignore[attr-defined]
    return job_id


def judgement(front: Front, job_id: str) -> dict:
    return json.loads(connection(front).get(keys.JUDGEMENT_PREFIX + job_id) or b"{}")


def test_a_suspect_job_is_played_accepted_and_regenerated(front: Front, browser: object) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    jobs = [submit(front, ACME, f"Suspect line number {n}.") for n in ("one", "two", "three")]
    for job_id in jobs:
        wait_done(front, ACME, job_id)
    sign_in(browser, front, ACME, name="Ann")
    browser.get(_local(front) + "/ui/suspects")  # type: ignore[attr-defined]
    assert "?queue=1" in browser.current_url  # type: ignore[attr-defined]  # the judging queue

    browser.get(_local(front) + f"/ui/jobs/{jobs[0]}?queue=1")  # type: ignore[attr-defined]
    assert browser.find_element(By.ID, "verdict").text == "suspect"  # type: ignore[attr-defined]
    played = browser.execute_async_script(  # type: ignore[attr-defined]
        "const done = arguments[0]; const p = document.getElementById('player');"
        "p.play().then(() => setTimeout(() => done(p.currentTime), 700), e => done(-1));"
    )
    assert played > 0  # the audio element plays the job's audio through /ui/jobs/{id}/audio
    width = browser.execute_script(  # type: ignore[attr-defined]
        "return document.getElementById('spectrogram').naturalWidth"
    )
    assert width == 1000
    assert _judge_by_key(browser, "a") == jobs[0]  # A: accepted, and on to the next suspect
    assert "/ui/jobs/" in browser.current_url or "/ui/suspects" in browser.current_url  # type: ignore[attr-defined]
    record = judgement(front, jobs[0])
    assert record["action"] == "accepted" and record["by"] == "Ann (tenant acme)"
    assert str(jobs[0]).encode() not in connection(front).zrange(keys.SUSPECT_INDEX, 0, -1)

    browser.get(_local(front) + f"/ui/jobs/{jobs[1]}")  # type: ignore[attr-defined]
    browser.find_element(By.ID, "judge-regenerated").click()  # type: ignore[attr-defined]
    # The click posts a form: the page with the new job's link loads after it returns.
    wait_for(lambda: browser.find_elements(By.ID, "new-job"), 20, "the new job's link")  # type: ignore[attr-defined]
    new_id = browser.find_element(By.ID, "new-job").get_attribute("href").rsplit("/", 1)[1]  # type: ignore[attr-defined]
    record = judgement(front, jobs[1])
    assert record["action"] == "regenerated" and record["new_job"] == new_id
    old, new = (
        Job.fetch(i, connection=connection(front), serializer=JSONSerializer)
        for i in (jobs[1], new_id)
    )
    assert new.kwargs["request"]["text"] == old.kwargs["request"]["text"]
    assert new.kwargs["request"]["seed"] != old.kwargs["request"].get("seed")
    assert new.meta[keys.SUBMIT_META_KEY] is not None and new.origin.endswith(".acme")
    wait_done(front, ACME, new_id)  # a real job of acme's, through the normal path

    browser.get(_local(front) + f"/ui/jobs/{jobs[2]}?queue=1")  # type: ignore[attr-defined]
    assert _judge_by_key(browser, "f") == jobs[2]
    record = judgement(front, jobs[2])
    assert record["action"] == "failed" and record["by"] == "Ann (tenant acme)"


def _worker_states(browser: object, front: Front) -> dict[str, str]:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    browser.get(_local(front) + "/ui")  # type: ignore[attr-defined]
    rows = browser.find_elements(By.CSS_SELECTOR, "#workers tbody tr")  # type: ignore[attr-defined]
    found = {}
    for row in rows:
        cells = row.find_elements(By.TAG_NAME, "td")
        if len(cells) > 2:
            found[cells[0].text] = cells[2].text
    return found


def test_the_fleet_shows_a_worker_started_then_stopped(
    front: Front, browser: object, tmp_path: Path
) -> None:
    sign_in(browser, front, OPERATOR)
    before = set(_worker_states(browser, front))
    cluster = Cluster(redis_url=front.redis_url, root=tmp_path)  # the scripted engine: quick
    worker = cluster.start("run", log_name="extra.log", COSYQ_STORAGE_URL=front.storage.as_uri())
    try:
        new = wait_for(
            lambda: set(_worker_states(browser, front)) - before, 60, "the new worker on /ui"
        )
        (name,) = new
        wait_for(
            lambda: _worker_states(browser, front)[name] in ("idle", "busy"), 60, "it to be idle"
        )
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        assert _worker_states(browser, front)[name] == "stopped"
    finally:
        cluster.stop_all()


def test_a_documents_lost_segment_is_retried_from_its_page(front: Front, browser: object) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    with front.http(ACME) as http:
        answer = http.post(
            "/v1/documents",
            json={"text": "The first sentence of this small document. And here is the second one."},
        )
        assert answer.status_code == 202, answer.text
        document_id = answer.json()["id"]
        wait_for(
            lambda: http.get(f"/v1/documents/{document_id}").json()["state"] == "assembled",
            DONE_TIMEOUT_S,
            "the document to be assembled",
            interval=0.5,
        )
    redis_ = connection(front)
    jobs = {
        int(k): v.decode() for k, v in redis_.hgetall(document_key(document_id, "jobs")).items()
    }
    assert len(jobs) >= 2
    redis_.hdel(document_key(document_id, "done"), "1")  # segment 1 lost: no record, no job
    redis_.delete(Job.key_for(jobs[1]))

    with front.http(BETA) as http:  # another tenant can neither see nor retry it
        assert http.post(f"/v1/documents/{document_id}:retry").status_code == 404
    assert redis_.hget(document_key(document_id, "jobs"), "1").decode() == jobs[1]

    sign_in(browser, front, ACME)
    browser.get(_local(front) + f"/ui/documents/{document_id}")  # type: ignore[attr-defined]
    assert "its job is gone" in browser.find_element(By.ID, "segment-1").text  # type: ignore[attr-defined]
    start = float(
        browser.find_element(By.CSS_SELECTOR, "#segment-0 .segment-play").get_attribute(
            "data-start"
        )  # type: ignore[attr-defined]
    )
    played = browser.execute_async_script(  # type: ignore[attr-defined]
        "const done = arguments[0]; const p = document.getElementById('document-player');"
        "document.querySelector('#segment-0 .segment-play').click();"
        "setTimeout(() => done(p.paused ? -1 : p.currentTime), 700);"
    )
    assert played >= start  # segment 0 plays from its span of the assembled file
    browser.find_element(By.ID, "document-retry").click()  # type: ignore[attr-defined]

    redone = wait_for(
        lambda: (
            (redis_.hget(document_key(document_id, "jobs"), "1") or b"").decode() != jobs[1]
            and redis_.hget(document_key(document_id, "jobs"), "1").decode()
        ),
        20,
        "segment 1 to have a new job",
    )
    with front.http(ACME) as http:
        wait_for(
            lambda: http.get(f"/v1/documents/{document_id}").json()["state"] == "assembled",
            DONE_TIMEOUT_S,
            "the document to be assembled again",
            interval=0.5,
        )
    browser.refresh()  # type: ignore[attr-defined]
    link = browser.find_element(By.CSS_SELECTOR, "#segment-1 a.segment-job")  # type: ignore[attr-defined]
    assert link.get_attribute("href").endswith(f"/ui/jobs/{redone}")


def test_a_session_post_needs_its_token_and_its_origin(front: Front) -> None:
    """A signed-in browser's judgement needs the session's CSRF token and a same-origin POST;
    neither alone does anything."""
    job_id = submit(front, ACME, "Token check line.")
    wait_done(front, ACME, job_id)
    with httpx.Client(base_url=front.url, timeout=30) as http:
        signed = http.post("/ui/signin", data={"key": ACME})
        assert signed.status_code == 303
        session = signed.headers["set-cookie"].split(";", 1)[0]  # cosyq_ui=<id>
        assert ACME not in signed.headers["set-cookie"]
        page = http.get(f"/ui/jobs/{job_id}", headers={"Cookie": session}).text
        token = re.search(r'name="csrf" value="([^"]+)"', page)
        assert token is not None
        judge = f"/ui/jobs/{job_id}/judge"
        for headers, data in (
            ({"Cookie": session}, {"action": "accepted"}),
            ({"Cookie": session}, {"action": "accepted", "csrf": "forged"}),
            (
                {"Cookie": session, "Origin": "http://evil.example"},
                {"action": "accepted", "csrf": token[1]},
            ),
        ):
            assert http.post(judge, headers=headers, data=data).status_code == 403
            assert connection(front).get(keys.JUDGEMENT_PREFIX + job_id) is None
        done = http.post(
            judge, headers={"Cookie": session}, data={"action": "accepted", "csrf": token[1]}
        )
        assert done.status_code == 303
        assert connection(front).get(keys.JUDGEMENT_PREFIX + job_id) is not None
        again = http.post(  # a second click: the first judgement stands
            judge, headers={"Cookie": session}, data={"action": "failed", "csrf": token[1]}
        )
        assert again.status_code == 400 and "already accepted" in again.text
        assert judgement(front, job_id)["action"] == "accepted"


def test_bearer_callers_and_the_schema(front: Front) -> None:
    """Scripts read the page with the bearer header; a wrong key is 401; a browser without a
    session goes to the sign-in form; no /ui route is in /openapi.json."""
    with httpx.Client(base_url=front.url, timeout=30) as http:
        assert http.get("/ui", headers={"Authorization": f"Bearer {OPERATOR}"}).status_code == 200
        assert http.get("/ui", headers={"Authorization": "Bearer wrong"}).status_code == 401
        anonymous = http.get("/ui/jobs")
        assert anonymous.status_code == 303 and anonymous.headers["location"] == "/ui/signin"
        paths = http.get("/openapi.json").json()["paths"]
        assert not [path for path in paths if path.startswith("/ui")]
        signed = http.post(
            "/ui/signin", data={"key": ACME}, headers={"Origin": "http://evil.example"}
        )
        assert signed.status_code == 403 and "set-cookie" not in signed.headers
