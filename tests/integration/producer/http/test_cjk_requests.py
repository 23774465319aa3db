"""Chinese, Japanese and Korean over HTTP (the real front, a tiny-model worker behind it), as
CosyVoice's users mostly send them: POST /v1/jobs, /v1/audio/speech and /v1/documents (SSML and
Markdown in Chinese). Each accepted request finishes; the model is given every character that
was sent (its pieces' text: numbers spelled out, nothing dropped); what is too long for one job
is refused at submit, 400, saying why, not accepted and failed in the worker."""

from __future__ import annotations

import io
import re
from pathlib import Path

import httpx
import pytest
import soundfile as sf

from tests.doubles.harness import wait_for
from tests.integration.producer.http.conftest import Front
from tests.integration.producer.http.test_jobs_api import wait_finished

pytestmark = pytest.mark.slow

CORPUS = Path(__file__).parents[3] / "data" / "corpus"
ZH = "我们用 Kubernetes 部署了 v2.3.1 版本，上线时间是2026年12月7日下午3点。生僻字：𠮷野家。"
JA = "ﾒﾆｭｰには「本日のｺｰﾋｰ　４５０円」と書かれている。"
KO = "오늘의 빵 가격은 3,500원이고, 2개 샀어요."
HAN_OR_KANA = re.compile("[\u3040-\u30ff\u4e00-\u9fff\U00020000-\U0003134f]")


def read_as(http: httpx.Client, job_id: str) -> str:
    doc = wait_finished(http, job_id, timeout=120.0)
    assert doc["state"] == "finished", doc
    return "".join(piece["text"] for piece in doc["result"]["pieces"])


def test_jobs_in_chinese_japanese_korean_finish_with_every_character_read(live: Front) -> None:
    with live.http() as http:
        ids = {}
        for name, text in (("zh", ZH), ("ko", KO)):
            answer = http.post("/v1/jobs", json={"text": text, "seed": 3})
            assert answer.status_code == 202, answer.text
            ids[name] = answer.json()["id"]
        speech = {"model": "tts-1", "input": JA, "response_format": "wav"}
        spoken = http.post("/v1/audio/speech", json=speech)
        assert spoken.status_code == 200, spoken.text
        assert sf.info(io.BytesIO(spoken.content)).samplerate == 24000
        zh, ko = read_as(http, ids["zh"]), read_as(http, ids["ko"])
        ja = read_as(http, spoken.headers["x-cosyq-job-id"])
    assert "二零二六年十二月七日" in zh and "二点三点一" in zh and "Kubernetes" in zh, zh
    assert set(HAN_OR_KANA.findall(ZH)) <= set(zh), zh  # 𠮷 too: nothing dropped
    assert "삼천오백원" in ko and "두 개" in ko, ko
    assert "メニュー" in ja and "コーヒー" in ja and "四百五十円" in ja, ja


def test_a_chinese_job_longer_than_one_may_speak_is_refused_at_submit(live: Front) -> None:
    chapter = (CORPUS / "zh_commas.txt").read_text(encoding="utf-8").strip()
    with live.http() as http:
        answer = http.post("/v1/jobs", json={"text": (chapter * 3)[:2000]})
        speech = {"model": "tts-1", "input": (chapter * 3)[:2000]}
        openai = http.post("/v1/audio/speech", json=speech)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("text: about ") and "Chinese, Japanese or Korean" in message
    assert "COSYQ_MAX_SPEECH_SECONDS" in message
    assert openai.status_code == 400
    assert openai.json()["error"]["message"].startswith("input: about ")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["zh_ssml.txt", "zh_doc.md"])
def test_chinese_ssml_and_markdown_documents_are_assembled(live: Front, name: str) -> None:
    text = (CORPUS / name).read_text(encoding="utf-8")
    markup = "markdown" if name.endswith(".md") else "auto"
    with live.http() as http:
        answer = http.post("/v1/documents", json={"text": text, "markup": markup, "seed": 1})
        assert answer.status_code == 202, answer.text
        document_id = answer.json()["id"]

        def done() -> dict | None:
            status = http.get(f"/v1/documents/{document_id}").json()
            return status if status["state"] in ("assembled", "failed", "incomplete") else None

        status = wait_for(done, 240.0, f"document {document_id}", interval=0.5)
        assert status["state"] == "assembled", status
        vtt = http.get(f"/v1/documents/{document_id}/captions", params={"format": "vtt"}).text
    said = vtt.replace("\n", "").replace(" ", "")
    for words in (
        ("新闻播报", "天气预报") if name.endswith(".txt") else ("产品发布说明", "备份数据库")
    ):
        assert words in said, vtt
    assert "cosyq" not in said  # the Markdown's code block is not read
