"""Ordinary texts people send as documents (tests/data/corpus: a README, a blog post, a
contract, a changelog, a transcript, a poem, a run-on sentence, a list of lines, a Windows
file, mixed scripts, symbols and code-like prose, an e-mail, one with a base64 attachment and a
long URL; in Chinese a novel's chapter, a paragraph of commas only, classical Chinese with no
punctuation, numbers and dates among English words, Markdown and SSML; Japanese, Korean,
Cantonese) on the real engine (tiny model,
every piece forced to a few speech tokens). Each is assembled, never stuck or crashed; its
manifest is JSON with the document's segments; its SRT and WebVTT parse, have a cue per
caption, and show every word the manifest says was spoken. The same texts cut to a job's
length are accepted as single jobs, or refused with a reason that names what to change."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import srt

from producer import CosyqClient
from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request
from shared.settings import Settings
from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, clean_database, client_settings, pool_of_two

CORPUS = Path(__file__).parents[2] / "data" / "corpus"
TEXTS = sorted(p.name for p in CORPUS.iterdir())
# Angle brackets in prose ("List<String>", "<b>", the model's "<|user|>"): sent as `plain`,
# read as written, as a document and as a job alike (as `auto`, refused as markup, the reason
# naming `plain`). The README's special token is inside a code span, which the document's
# Markdown reading keeps as characters (as a job it is refused, its reason naming it); 2,000
# characters of base64 are spelled out letter by letter, longer than a job may speak (a
# document splits them).
PLAIN = {"special_token.txt", "tags.txt"}
REFUSED_JOB = {
    "readme.md": "special token <|endoftext|>",
    "attachment.txt": "of speech (at least 527 words or numbers",
    # 787 Han characters, ~157 s (Qwen2 would count ~165-190 s): the worker refused it too
    "zh_commas.txt": "of speech (787 Chinese, Japanese or Korean characters, 157 s",
}
# Words each text must be heard saying (its captions show them), beyond the manifest's own.
MUST_SAY = {
    "readme.md": ["Installation", "Vector", "endoftext"],  # not <details>'s HTML
    "attachment.txt": ["logo", "Thanks", "Mia"],
    "scripts.txt": ["Καλημέρα", "שלום"],
    "blog.txt": ["prototype", "eventually"],
    "legal.txt": ["Licensee", "Territory", "Smith"],
    "changelog.md": ["Latency", "tolerances"],
    "transcript.txt": ["ALICE", "adjourned"],
    "poem.txt": ["diverged", "difference"],
    "longsentence.txt": ["children"],
    "newlines.txt": ["Milk", "flights"],
    "windows.txt": ["Meeting", "Windows"],
    "mixed.txt": ["München", "Добро", "مرحبا", "formidable"],
    "symbols.txt": ["Jerry", "Templates", "redirect"],
    "email.txt": ["Thursday", "Alex"],
    "special_token.txt": ["user", "template"],
    "tags.txt": ["String", "bold"],
    "zh_novel.txt": ["林晓", "末班车", "一九八七年"],
    "zh_commas.txt": ["鹅卵石", "恋恋不舍"],
    "classical.txt": ["桃花", "太守"],
    "ja.txt": ["喫茶店", "佐藤さん"],
    "ko.txt": ["빵집", "할머니"],
    "yue.txt": ["茶餐廳", "奶茶"],
    "zh_mixed.txt": ["Kubernetes", "𠮷野家", "𩸽鱼", "兼容汉字"],
    "zh_doc.md": ["产品发布说明", "备份数据库"],
    "zh_ssml.txt": ["新闻播报", "天气预报"],
}
WORD_RE = re.compile(r"\w+")


@pytest.fixture(scope="module")
def cluster(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("corpus")
    overrides = {
        "COSYQ_ENGINE": "tests.doubles.engines:tiny_directed",
        "COSYQ_MODEL_DIR": str(tiny_model_dir),
        "COSYQ_DEVICE": "cpu",
        "COSYQ_HASH_CACHE_DIR": str(root / "hashes"),
        "COSYQ_THREADS": "1",
        "TESTENGINE_FORCED_TOKENS": "4",
        "TESTENGINE_FLOW_STEPS": "1",  # the captions are checked here, not the audio
        "COSYQ_MAX_PIECE_TOKENS": "400",  # fewer pieces (each a whole pass of the tiny model)
    }
    with clean_database(redis_server.url) as url, pool_of_two(url, root, overrides) as cluster:
        yield cluster


@pytest.fixture
def settings(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return client_settings(cluster, monkeypatch)


def path_of(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


def request_of(name: str) -> dict[str, object]:
    text = (CORPUS / name).read_bytes().decode("utf-8")
    markup = "markdown" if name.endswith(".md") else "plain" if name in PLAIN else "auto"
    return {"text": text, "markup": markup, "seed": 7}


def unescaped(vtt_text: str) -> str:
    return vtt_text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


@pytest.mark.timeout(300)
def test_each_ordinary_text_is_assembled_with_valid_manifest_and_captions(
    settings: Settings,
) -> None:
    """All at once, so the two workers share the corpus's segments (one wait, not twelve)."""
    import webvtt  # noqa: PLC0415

    with CosyqClient(settings) as client:
        submitted = {name: client.submit_document(request_of(name)) for name in TEXTS}
        results = {name: client.document_result(d, timeout=240) for name, d in submitted.items()}
    assert set(results) == set(MUST_SAY)
    missing = {}
    for name, result in results.items():
        manifest = json.loads(path_of(result.manifest_uri).read_text())
        assert len(manifest["segments"]) == result.segments >= 1, name
        cues = manifest["captions"]
        subtitles = list(srt.parse(path_of(result.srt_uri).read_text()))
        vtt = webvtt.from_string(path_of(result.vtt_uri).read_text())
        assert len(subtitles) == len(vtt) == len(cues) >= result.segments, name
        shown_srt = " ".join(s.content for s in subtitles)
        shown_vtt = unescaped(" ".join(c.text for c in vtt))
        assert shown_srt == shown_vtt.replace("-->", "->").replace("\n", " "), name
        spoken = " ".join(s["text"] for s in manifest["segments"])
        # every word of letters (units such as "ms" or "GB" are spelled out)
        words = {w.lower() for w in WORD_RE.findall(spoken) if w.isalpha() and len(w) > 3} | {
            w.lower() for w in MUST_SAY[name]
        }
        # Chinese and Japanese write no spaces: a run cut between two cues is still said
        # ... and say half-width katakana in its ordinary width (ﾒﾆｭｰ is メニュー)
        shown = unicodedata.normalize("NFKC", shown_vtt).lower()
        unspaced = shown.replace(" ", "")
        missing[name] = sorted(
            w for w in words if unicodedata.normalize("NFKC", w) not in shown + "\n" + unspaced
        )
    assert not any(missing.values()), missing


@pytest.mark.parametrize("name", TEXTS)
def test_each_text_cut_to_a_job_is_a_valid_job(name: str) -> None:
    limits = RequestLimits()
    text = request_of(name)["text"]
    assert isinstance(text, str)
    cut = text[: limits.max_text_chars]
    markup = "plain" if name in PLAIN else "auto"
    if name in PLAIN:  # refused as auto, naming what to send instead
        with pytest.raises(InvalidRequestError, match='send markup "plain"'):
            validate_request({"text": cut}, limits)
    if name in REFUSED_JOB:
        with pytest.raises(InvalidRequestError, match=re.escape(REFUSED_JOB[name])):
            validate_request({"text": cut, "markup": markup}, limits)
        return
    validate_request({"text": cut, "markup": markup}, limits)
