"""Settings: COSYQ_ variables and .env are read; typos and bad values are refused clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import SettingsError
from shared.settings import Settings, load_settings, redact_url

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py


def test_defaults(clean_env: Path) -> None:
    settings = load_settings()
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.storage_url == (clean_env / "cosyq-output").resolve().as_uri()
    assert settings.backend == "auto"
    assert settings.max_text_chars == 2000
    assert settings.backpressure == "raise"


def test_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_REDIS_URL", "rediss://alice:s3cret@redis.example:6380/2")
    monkeypatch.setenv("COSYQ_STORAGE_URL", "s3://bucket/audio")
    monkeypatch.setenv("COSYQ_MODEL_DIR", "/models/CosyVoice2-0.5B")
    monkeypatch.setenv("COSYQ_BACKEND", "coreml")
    monkeypatch.setenv("COSYQ_DEVICE", "mps")
    monkeypatch.setenv("COSYQ_MAX_JOBS", "7")
    settings = load_settings()
    assert settings.redis_url.startswith("rediss://alice:")
    assert settings.storage_url == "s3://bucket/audio"
    assert settings.model_dir == Path("/models/CosyVoice2-0.5B")
    assert (settings.backend, settings.device, settings.max_jobs) == ("coreml", "mps", 7)


def test_unknown_variable_is_rejected_with_a_suggestion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_REDIS_ULR", "redis://x")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert "unknown setting COSYQ_REDIS_ULR (from the environment)" in message
    assert "did you mean COSYQ_REDIS_URL?" in message


def test_unknown_variable_is_rejected_by_plain_constructor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_NOT_A_THING", "1")
    with pytest.raises(SettingsError, match="COSYQ_NOT_A_THING"):
        Settings()


def test_harness_variables_are_not_settings_but_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_REFERENCE_DIR", "/somewhere")
    monkeypatch.setenv("COSYQ_REQUIRE_REFERENCE", "1")
    monkeypatch.setenv("COSYQ_PYTHON", "python3.12")
    load_settings()


def test_env_file_is_read_and_its_typos_rejected(clean_env: Path) -> None:
    (clean_env / ".env").write_text("COSYQ_MAX_QUEUE_DEPTH=12\nAWS_REGION=eu-west-1\n")
    assert load_settings().max_queue_depth == 12
    (clean_env / ".env").write_text("COSYQ_MAX_QUEUE_DEPHT=12\n")
    with pytest.raises(SettingsError, match=r"COSYQ_MAX_QUEUE_DEPHT \(from the .env file\)"):
        load_settings()
    assert load_settings(env_file=None).max_queue_depth == 10000


def test_environment_overrides_env_file(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (clean_env / ".env").write_text("COSYQ_MAX_JOBS=5\n")
    monkeypatch.setenv("COSYQ_MAX_JOBS", "9")
    assert load_settings().max_jobs == 9


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("COSYQ_MAX_JOBS", "abc", "COSYQ_MAX_JOBS: Input should be a valid integer"),
        ("COSYQ_MAX_JOBS", "0", "COSYQ_MAX_JOBS: Input should be greater than 0"),
        ("COSYQ_BACKEND", "tensorflow", "COSYQ_BACKEND: Input should be 'auto', 'torch'"),
        ("COSYQ_REDIS_URL", "http://x", "COSYQ_REDIS_URL: Value error, scheme must be one of"),
        ("COSYQ_STORAGE_URL", "ftp://x/y", "COSYQ_STORAGE_URL: Value error, must start with"),
        ("COSYQ_STORAGE_URL", "s3:///prefix", "an s3 URL needs a bucket"),
        ("COSYQ_STORAGE_URL", "file://relative/path", "a file URL needs an absolute path"),
        ("COSYQ_LOG_LEVEL", "LOUD", "COSYQ_LOG_LEVEL: Value error, must be DEBUG"),
        ("COSYQ_HEARTBEAT_TTL_S", "1", "heartbeat_ttl_s must be longer"),
    ],
)
def test_bad_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert expected in str(caught.value)


def test_redis_password_is_kept_out_of_repr_and_redacted() -> None:
    settings = load_settings(redis_url="redis://alice:s3cret@host:6379/0")
    assert "s3cret" not in repr(settings)
    assert settings.redacted_redis_url() == "redis://alice:***@host:6379/0"
    assert redact_url("redis://:pw@host/0") == "redis://:***@host/0"
    assert redact_url("redis://host/0") == "redis://host/0"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://alice:pw/S1@h:6379/0", "redis://alice:***@h:6379/0"),
        ("redis://alice:12?S1@h:6379/0", "redis://alice:***@h:6379/0"),
        ("redis://alice:p@w#S1@h:6379/0", "redis://alice:***@h:6379/0"),
        ("unix://:pw/S1@/run/redis.sock", "unix://:***@/run/redis.sock"),
        ("unix:///run/redis@main.sock", "unix:///run/redis@main.sock"),  # an '@' in a path
        ("redis://h:1/0?password=p@S1", "redis://h:1/0?password=***"),
        ("https://h:8443/in?to=a@b", "https://h:8443/in?to=a@b"),
    ],
)
def test_a_password_with_a_raw_delimiter_is_masked_whole(url: str, shown: str) -> None:
    """A raw '/', '?' or '#' in a password ends it early for urlsplit: the rest is masked too."""
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://h/in?code=AZ1&token=T2&flag", "https://h/in?code=***&token=***&***"),
        ("https://u:pw@h/in?sig=S", "https://***@h/in?sig=***"),
        ("https://h/in", "https://h/in"),
        ("https://h/in?", "https://h/in?"),
    ],
)
def test_a_webhook_url_is_shown_without_any_query_value(url: str, shown: str) -> None:
    """A tenant's receiver token may go by any name in its webhook URL's query."""
    assert redact_url(url, keep_user=False, keep_query=False) == shown


def test_a_redis_ca_bundle_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    # a missing bundle reached Redis's connect as "No such file or directory": an outage
    # waited out for ever, not a setting to fix
    for where in (tmp_path / "no-such-ca.pem", tmp_path):
        with pytest.raises(SettingsError, match=r"^invalid settings: COSYQ_REDIS_SSL_CA_CERTS: "):
            load_settings(env_file=None, redis_ssl_ca_certs=where)
    bundle = tmp_path / "ca.pem"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    assert load_settings(env_file=None, redis_ssl_ca_certs=bundle).redis_ssl_ca_certs == bundle


def test_a_webhook_url_prefix_without_its_scheme_is_refused() -> None:
    # "hooks.example.com" is the start of no http(s) URL: every webhook would be refused
    with pytest.raises(SettingsError, match=r"COSYQ_WEBHOOK_ALLOWED_URLS: .*entry 2 does not"):
        load_settings(env_file=None, webhook_allowed_urls="https://a.example.com/, b.example.com")
    allowed = "https://a.example.com/, HTTP://b.example.com:8080/hooks/"
    assert load_settings(env_file=None, webhook_allowed_urls=allowed).webhook_allowed_urls


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_redis_url_says_so_once(empty: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env_file=None, redis_url=empty)
    message = str(caught.value)
    assert "COSYQ_REDIS_URL: Value error, is empty: unset it for the default" in message
    assert message.count("(got ") == 1


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("COSYQ_REDIS_URL", "alice:forgot-scheme-6P@127.0.0.1:6379/0"),
        ("COSYQ_REDIS_URL", ":forgot-scheme-6P@127.0.0.1:6379/0"),
        ("COSYQ_STORAGE_URL", "key:forgot-scheme-6P@bucket/audio"),
        ("COSYQ_S3_ENDPOINT_URL", "ak:forgot-scheme-6P@minio:9000"),
        ("COSYQ_PROMPT_ROOTS", "file:///srv/prompts,key:forgot-scheme-6P@bucket/x"),
        ("COSYQ_WEBHOOK_ALLOWED_URLS", "key:forgot-scheme-6P@hooks.example/x"),
    ],
)
def test_a_url_whose_scheme_was_forgotten_is_refused_with_its_password_masked(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # without its scheme:// no pattern took it for a URL: the refusal quoted the password
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"invalid settings: {name}: ") and "\n" not in message
    assert "forgot-scheme-6P" not in message and ":***@" in message, message
