"""Remake the /ui screenshots in docs/ (1280x800): a private redis-server, `cosyq serve` with two
tenants and an operator key, one worker on the tiny random-weight model whose quality check
calls every result suspect, a few jobs and a document, then headless chromium.

    .venv/bin/python scripts/ui_screenshots.py

Uses the integration tests' harness (tests/) and Debian's chromium + chromedriver.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from selenium import webdriver  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

from tests.conftest import RedisServer  # noqa: E402
from tests.doubles.harness import wait_for  # noqa: E402
from tests.integration.producer.http.conftest import start_front, start_tiny_pool  # noqa: E402
from workers.tools.fixtures.tiny import write_tiny_model  # noqa: E402

OPERATOR = "operator-key-" + "5" * 20
ACME, BETA = "acme-key-" + "6" * 24, "beta-key-" + "7" * 24
TEXTS = (
    "Good morning, and welcome to the quarterly update.",
    "Shipping volumes rose by twelve percent in March.",
    "Please hold while we connect your call.",
)


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        server = RedisServer(root / "redis")
        server.start()
        model = root / "model"
        write_tiny_model(model)
        front = start_front(
            root / "front",
            server.url,
            COSYQ_API_KEYS=f"acme:{ACME},beta:{BETA}",
            COSYQ_OPERATOR_KEYS=OPERATOR,
            COSYQ_DOCUMENT_SEGMENT_CHARS="60",
        )
        pool = start_tiny_pool(
            root,
            front,
            model,
            COSYQ_TENANTS="acme,beta",
            COSYQ_QUALITY_MIN_LENGTH_RATIO="1000",
            COSYQ_QUALITY_MIN_EXPECTED_S="0",
        )
        try:
            shoot(front.url.replace("127.0.0.1", "localhost"), front.url)
        finally:
            front.stop()
            pool.stop_all()
            server.stop()


def submit(url: str) -> tuple[list[str], str]:
    jobs = []
    for key, text in [(ACME, t) for t in TEXTS] + [(BETA, "Another tenant's line.")]:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
            jobs.append(http.post("/v1/jobs", json={"text": text, "voice": None}).json()["id"])
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ACME}"}) as http:
        text = "Chapter one. The harbour was quiet at dawn. Gulls circled over the empty quay."
        document = http.post("/v1/documents", json={"text": text}).json()["id"]
        wait_for(
            lambda: http.get(f"/v1/documents/{document}").json()["state"] == "assembled",
            300,
            "the document",
            interval=1,
        )
        for job in jobs[:3]:
            wait_for(
                lambda job=job: http.get(f"/v1/jobs/{job}").json()["state"] == "finished",
                300,
                "the jobs",
                interval=1,
            )
    return jobs, document


def shoot(browser_url: str, url: str) -> None:
    jobs, document = submit(url)
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--window-size=1280,800", "--mute-audio"):
        options.add_argument(argument)
    driver = webdriver.Chrome(
        options=options, service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver")
    )
    docs = ROOT / "docs"
    try:
        driver.set_window_size(1280, 800)
        driver.get(browser_url + "/ui/signin")
        driver.save_screenshot(str(docs / "ui-signin.png"))
        driver.find_element(By.ID, "key").send_keys(OPERATOR)
        driver.find_element(By.ID, "name").send_keys("Ann")
        driver.find_element(By.ID, "signin").click()
        time.sleep(1)
        driver.save_screenshot(str(docs / "ui-fleet.png"))
        driver.get(browser_url + "/ui/jobs")
        driver.save_screenshot(str(docs / "ui-jobs.png"))
        driver.get(browser_url + f"/ui/jobs/{jobs[0]}?queue=1")
        time.sleep(1)
        driver.save_screenshot(str(docs / "ui-job.png"))
        driver.get(browser_url + f"/ui/documents/{document}")
        driver.save_screenshot(str(docs / "ui-document.png"))
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
