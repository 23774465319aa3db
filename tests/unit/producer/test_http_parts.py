"""The HTTP front's pieces that need no server: key check, bind rule, OpenAI -> job mapping."""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from starlette.routing import BaseRoute

from producer.cli import main
from producer.http.app import KEYED_ROUTERS, create_app
from producer.http.auth import KeyCheck
from producer.http.context import FrontContext
from producer.http.errors import ApiError, param_of
from producer.http.middleware import FORM_PREFIX
from producer.http.speech import job_payload, parse_speech, pcm_of, renamed
from producer.http.storage_read import check_owned
from producer.http.ui import access, document_pages, pages
from producer.http_bind import check_bind, is_loopback
from shared.errors import SettingsError
from shared.jobs import RequestLimits, validate_request
from shared.settings import load_settings
from shared.storage import stored_key
from shared.tenants import ApiKey


def test_keys_match_only_exactly() -> None:
    check = KeyCheck(("alpha-key", "beta-key"))
    assert check.matches("beta-key") and check.matches("alpha-key")
    assert not check.matches("beta-ke") and not check.matches("beta-key ")
    assert not check.matches("") and not KeyCheck(()).enabled


def test_an_operator_key_is_tenant_default_with_the_operator_flag() -> None:
    check = KeyCheck((ApiKey("alpha", "alpha-key"),), operator_keys=("op-key",))
    assert check.matching_key("op-key") == ("default", True)
    assert check.matching_key("alpha-key") == ("alpha", False)
    assert check.matching_key("op-ke") is None and check.matching_key("op-key ") is None
    assert KeyCheck((), operator_keys=("op-key",)).enabled  # operator keys alone turn keys on


def test_settings_split_api_keys_at_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_API_KEYS", " key-uno, key-dos ,,key-tres ")
    settings = load_settings(env_file=None)
    assert settings.api_key_list() == ("key-uno", "key-dos", "key-tres")
    assert "key-" not in repr(settings)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_may_bind_without_keys(host: str) -> None:
    assert is_loopback(host)
    check_bind(host, ())


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_other_addresses_need_keys(host: str) -> None:
    with pytest.raises(SettingsError, match="without COSYQ_API_KEYS"):
        check_bind(host, ())
    check_bind(host, ("a-key",))


def test_serve_refuses_a_public_bind_without_keys_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COSYQ_API_KEYS", raising=False)
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "binds only loopback" in err


def test_openai_request_maps_to_a_valid_job() -> None:
    speech = parse_speech(
        {
            "model": "tts-1",
            "input": "Hi.",
            "voice": "alice",
            "response_format": "pcm",
            "speed": 1.5,
            "instructions": "Whisper.",
        }
    )
    request = validate_request(job_payload(speech), RequestLimits())
    assert (request.text, request.voice, request.speed) == ("Hi.", "alice", 1.5)
    assert (request.format, request.sample_rate) == ("wav", 24000)
    assert (request.mode, request.instruction) == ("instruct2", "Whisper.")
    default = validate_request(
        job_payload(parse_speech({"model": "tts-1", "input": "x"})), RequestLimits()
    )
    assert default.format == "mp3" and default.voice == "default"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "tts-1"}, "input"),
        ({"model": "whisper-1", "input": "x"}, "model"),
        ({"model": "tts-1", "input": "x", "response_format": "aac"}, "response_format"),
        ({"model": "tts-1", "input": "x", "stream_format": "video"}, "stream_format"),
        ({"model": "tts-1", "input": "x", "seed": 3}, "seed"),
    ],
)
def test_bad_openai_requests_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        parse_speech(body)
    assert caught.value.status == 400 and caught.value.param == param


def test_contract_errors_use_openai_field_names() -> None:
    message = "text: must not be empty; speed: 9.0 is outside 0.5-2.0; instruction: required"
    assert renamed(message) == (
        "input: must not be empty; speed: 9.0 is outside 0.5-2.0; instructions: required"
    )
    assert param_of("requests[3]: text: too long") == "text"
    assert param_of("no field here") is None


def test_pcm_is_the_wav_data_as_int16_le() -> None:
    samples = (np.arange(100, dtype=np.int16) * 50).astype(np.int16)
    buffer = io.BytesIO()
    sf.write(buffer, samples, 24000, format="WAV", subtype="PCM_16")
    assert pcm_of(buffer.getvalue()) == samples.astype("<i2").tobytes()


def test_audio_is_read_only_under_the_configured_storage(tmp_path: Path) -> None:
    """A URI outside the storage raises the route's own unknown-id error, as one another
    tenant owns does (no 500 that tells the two apart)."""
    settings = load_settings(env_file=None, storage_url=(tmp_path / "out").as_uri())
    context = FrontContext.create(settings)
    base = (tmp_path / "out").as_uri()
    check_owned(context, f"{base}/2026/12/01/job.wav", "default", LookupError("unknown"))
    outside = ("file:///etc/passwd", f"{base}/../secret.wav", f"{base}-other/x.wav", "s3://b/x")
    for uri in outside:
        unknown = LookupError("unknown")
        with pytest.raises(LookupError) as caught:
            check_owned(context, uri, None, unknown)  # nobody's: an operator reads any key
        assert caught.value is unknown
    context.client.close()


def test_a_stored_key_is_judged_as_it_will_be_opened() -> None:
    """A file URI's path percent-decoded first (a '..' hides as %2E%2E until then); an S3
    key as written; nothing a storage could not have written (another host, a query)."""
    base = "file:///srv/out%20put"
    assert stored_key(base, f"{base}/tenants/a/x.wav") == "tenants/a/x.wav"
    assert stored_key(base + "/", f"{base}/%40x%3D1.wav") == "@x=1.wav"
    for uri in (
        f"{base}/tenants/a/%2E%2E/b/x.wav",
        f"{base}/tenants/a/..%2Fb/x.wav",
        f"{base}/a//x.wav",
        f"{base}-other/x.wav",
        "file://host/srv/out%20put/x.wav",
        f"{base}/x.wav?y",
        "s3://bucket/x.wav",
    ):
        assert stored_key(base, uri) is None, uri
    assert stored_key("s3://bucket/pre", "s3://bucket/pre/tenants/a/x.wav") == "tenants/a/x.wav"
    assert stored_key("s3://bucket", "s3://bucket/x.wav") == "x.wav"
    for uri in ("s3://other/x.wav", "s3://bucket/pre/../x.wav", "s3://bucket/prefix/x.wav"):
        assert stored_key("s3://bucket/pre", uri) is None, uri


def test_the_small_form_cap_covers_every_ui_form_and_no_api_route() -> None:
    """BodyLimit holds a body under FORM_PREFIX to COSYQ_UI_MAX_FORM_BYTES: every /ui POST
    (a form) is under that prefix, and no route behind the key check (the JSON cap's) is."""
    app = create_app(load_settings(env_file=None, api_keys="alpha:sk-alpha-0123456789"))
    keyed = {getattr(route, "path", "") for router in KEYED_ROUTERS for route in router.routes}
    forms = {
        path
        for router in (access.router, pages.router, document_pages.router)
        for route in router.routes
        if "POST" in getattr(route, "methods", ()) and (path := getattr(route, "path", ""))
    }
    paths = set(_paths(app.routes))
    assert forms and forms <= paths and keyed <= paths
    assert all(path.startswith(FORM_PREFIX) for path in forms)
    assert not any(path.startswith(FORM_PREFIX) for path in keyed)


def _paths(routes: Sequence[BaseRoute]) -> Iterator[str]:
    """Every route's path, through FastAPI's included routers (which wrap theirs)."""
    for route in routes:
        included = getattr(route, "original_router", None)
        yield from _paths(included.routes) if included is not None else [getattr(route, "path", "")]
