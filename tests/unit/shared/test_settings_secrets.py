"""A refused setting never prints a secret: whatever rule fails (one field's or a rule across
fields), the SettingsError names the variable and the rule and holds none of the Redis
password, S3 keys, API keys or webhook secret (shared/settings_errors.py)."""

from __future__ import annotations

import base64
import os
import string
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from shared.errors import SettingsError
from shared.settings import Settings, load_settings
from shared.settings_errors import URL_FIELDS, is_secret

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
SECRET_WORDS = ("secret", "password", "api_key", "operator_key", "access_key", "api_keys")

# Each starts with a mark no message holds: drawn bare, hypothesis found "COSYQ_REDIS_", which
# every COSYQ_REDIS_URL message names, and reported it as printed.
secret_text = st.text(string.ascii_letters + string.digits + "-_.~", min_size=9, max_size=37).map(
    lambda text: "Zq7" + text
)

# Rules across fields (model validators): each is valid field by field.
CROSS_FIELD_RULES: tuple[dict[str, Any], ...] = (
    {"heartbeat_interval_s": 10, "heartbeat_ttl_s": 5},
    {"redis_wait_replicas": 1, "redis_wait_timeout_s": 30, "heartbeat_ttl_s": 40},
    {"webhook_timeout_s": 10, "webhook_claim_idle_s": 10},
)


def _scalar_fields() -> list[str]:
    """Fields that refuse the text "not a value" (numbers, flags, choices)."""
    names = []
    for name, field in Settings.model_fields.items():
        args = {field.annotation, *typing.get_args(field.annotation)}
        if args & {int, float, bool} or typing.get_origin(field.annotation) is typing.Literal:
            names.append(name)
    return sorted(names)


@pytest.fixture(scope="module", autouse=True)
def no_caller_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.upper().startswith("COSYQ_"):
                patch.delenv(name)
        patch.chdir(tmp_path_factory.mktemp("no-env"))
        yield


def secrets_in(values: dict[str, str]) -> dict[str, Any]:
    return {
        "redis_url": f"redis://alice:{values['redis']}@127.0.0.1:6379/0",
        "s3_access_key_id": values["s3_id"],
        "s3_secret_access_key": values["s3_secret"],
        "api_keys": f"alpha:{values['alpha']},beta:{values['beta']}",
        "webhook_secret": "whsec_" + base64.b64encode(values["webhook"].encode()).decode(),
    }


@st.composite
def failing_rules(draw: st.DrawFn) -> dict[str, Any]:
    """One failing rule or several: a field's, a rule across fields, a secret field's own."""
    kind = draw(st.sampled_from(["cross", "field", "fields", "secret_field", "redis_scheme"]))
    if kind == "cross":
        return dict(draw(st.sampled_from(CROSS_FIELD_RULES)))
    if kind == "field":
        return {draw(st.sampled_from(_scalar_fields())): "not a value"}
    if kind == "fields":
        names = draw(st.lists(st.sampled_from(_scalar_fields()), min_size=2, max_size=6))
        return dict.fromkeys(names, "not a value")
    if kind == "secret_field":
        return {"api_keys": "alpha:" + draw(secret_text) + " with a space"}
    return {"redis_url": "http://alice:" + draw(secret_text) + "@h:1/0"}


@PROPERTY
@given(
    values=st.fixed_dictionaries(
        dict.fromkeys(("redis", "s3_id", "s3_secret", "alpha", "beta", "webhook"), secret_text)
    ),
    rule=failing_rules(),
)
def test_no_failing_rule_prints_a_secret(values: dict[str, str], rule: dict[str, Any]) -> None:
    given_values = secrets_in(values) | rule
    with pytest.raises(SettingsError) as caught:
        load_settings(env_file=None, **given_values)
    message = str(caught.value)
    assert message.startswith("invalid settings: ")
    for secret in (*values.values(), given_values["webhook_secret"], *_secrets_of(rule)):
        assert secret not in message, (rule, message)


def _secrets_of(rule: dict[str, Any]) -> list[str]:
    """The secret part a rule itself brings (a bad API key, a password in a bad Redis URL)."""
    found = []
    for name in ("api_keys", "redis_url"):
        if name in rule:
            found.append(rule[name].split(":", 2)[-1].split("@")[0].split(" ")[0])
    return found


def test_a_rule_across_fields_names_the_rule_and_shows_no_input() -> None:
    names = ("redis", "s3_id", "s3_secret", "alpha", "beta", "webhook")
    given_values = secrets_in({name: f"{name}-secret-value" for name in names}) | {
        "webhook_timeout_s": 10,
        "webhook_claim_idle_s": 5,
    }
    with pytest.raises(SettingsError) as caught:
        load_settings(env_file=None, **given_values)
    message = str(caught.value)
    assert "webhook_claim_idle_s must be longer than webhook_timeout_s" in message
    assert "got" not in message


def test_a_plain_field_still_shows_what_it_refused() -> None:
    with pytest.raises(SettingsError, match=r"COSYQ_MAX_JOBS: .* \(got 'many'\)"):
        load_settings(env_file=None, max_jobs="many")


def test_every_field_named_like_a_secret_is_secret() -> None:
    """A new key or password field (operator keys, say) is masked without a list to update."""
    for name, field in Settings.model_fields.items():
        if any(word in name for word in SECRET_WORDS) and name not in URL_FIELDS:
            assert is_secret(field), f"{name}: make it a SecretStr or mark it secret"
    assert is_secret(Settings.model_fields["s3_access_key_id"])
    assert SecretStr in typing.get_args(Settings.model_fields["webhook_secret"].annotation)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("redis_url", "redis://alice:pw-SECRET-1@[::1/0"),  # urlsplit itself refuses it
        ("redis_url", "redis://alice:pw-SECRET-1@host:99999/0"),  # a port out of range
        ("redis_url", "redis+sentinel://alice:pw-SECRET-1:s1:26379/main"),  # '@' forgotten
        ("redis_url", "redis://pw-SECRET-1@host:6379/x"),  # a password where the user goes
        ("redis_url", "redis://alice:pw-SECRET-1:host:6379/0"),  # '@' forgotten
        ("redis_url", "redis://alice:pw SECRET-1@host:6379/x"),  # a raw space in the password
        ("redis_url", "redis://alice:pw,SECRET-1@host:6379/x"),  # a raw comma
        # a raw '/', '?' or '#' ends user:password early (urlsplit's and redis-py's reading)
        ("redis_url", "redis://alice:pw/SECRET-1@host:6379/0"),
        ("redis_url", "redis://alice:12?SECRET-1@host:6379/0"),  # "12" would pass as a port
        ("redis_url", "redis://alice:p@w#SECRET-1@host:6379/0"),  # else host "w"
        ("redis_url", "redis+sentinel://alice:pw/SECRET-1@s1:26379/main"),
        ("redis_url", "unix://alice:pw/SECRET-1@/run/redis.sock"),  # else path /SECRET-1@/run/
        ("storage_url", "http://key:pw/SECRET-1@bucket/prefix"),
        ("prompt_roots", "file:///srv,s3://bucket/p,https://key:pw,SECRET-1@bucket/p"),
        ("storage_url", "http://key:pw-SECRET-1@bucket/prefix"),
        ("storage_url", "file://key:pw-SECRET-1@host/srv"),
        ("prompt_roots", "file:///srv,https://key:pw-SECRET-1@bucket/p"),
        ("storage_url", "s3://AKIA-ID:pw-SECRET-1@bucket/prefix"),  # would name every result
        ("storage_url", "s3://pw-SECRET-1@bucket/prefix"),
        ("prompt_roots", "file:///srv,s3://AKIA-ID:pw-SECRET-1@bucket/p"),
    ],
)
def test_a_refused_url_shows_none_of_its_credentials(name: str, value: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env_file=None, **{name: value})
    assert f"COSYQ_{name.upper()}" in str(caught.value)
    assert "SECRET-1" not in str(caught.value)


def test_a_refused_setting_chains_no_error_that_holds_the_input() -> None:
    """A traceback prints the chained ValidationError too, whose input is every setting."""
    given_values = secrets_in(
        {
            name: f"{name}-chained"
            for name in ("redis", "s3_id", "s3_secret", "alpha", "beta", "webhook")
        }
    )
    with pytest.raises(SettingsError) as caught:
        load_settings(env_file=None, **given_values, heartbeat_ttl_s=1)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_password_with_a_raw_delimiter_is_refused_with_how_to_write_it() -> None:
    with pytest.raises(SettingsError, match=r"must be percent-encoded \(%2F, %3F, %23\)"):
        load_settings(env_file=None, redis_url="redis://alice:pw#SECRET-1@host:6379/0")
    for fine in ("redis://alice:pw%2F1@host:6379/0", "unix:///run/redis@main.sock"):
        load_settings(env_file=None, redis_url=fine)  # encoded; an '@' in a socket's name
    load_settings(env_file=None, redis_url="redis://host:6379/0?password=p@ss")


def test_a_redis_password_in_the_query_is_masked() -> None:
    settings = load_settings(env_file=None, redis_url="redis://host:6379/0?password=pw-SECRET-2")
    assert "pw-SECRET-2" not in settings.redacted_redis_url()
    assert settings.redacted_redis_url() == "redis://host:6379/0?password=***"


def test_the_repr_of_settings_shows_no_secret() -> None:
    """A Settings in a log line, a traceback's locals or a test's failure shows no secret."""
    given_values = secrets_in(
        {
            name: f"{name}-repr-9Q"
            for name in ("redis", "s3_id", "s3_secret", "alpha", "beta", "webhook")
        }
    )
    settings = load_settings(
        env_file=None,
        **given_values,
        s3_endpoint_url="http://minio:endpoint-repr-9Q@127.0.0.1:9000",
        webhook_allowed_urls="https://hook:allowed-repr-9Q@example.com/",
        operator_keys="operator-repr-9Q",
    )
    for shown in (repr(settings), str(settings), f"{settings!r}"):
        assert "-repr-9Q" not in shown, shown
    assert "max_jobs=200" in repr(settings) and "127.0.0.1:9000" in repr(settings)


@pytest.mark.parametrize("secret", ["whsec_Äsigning-8TT", "whsec_signing 8TT!!", "sign-8TT"])
def test_a_signing_secret_that_is_not_base64_is_refused_unshown(secret: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env_file=None, webhook_secret=secret)
    message = str(caught.value)
    assert "COSYQ_WEBHOOK_SECRET: " in message and "base64" in message
    assert "8TT" not in message and "Ä" not in message


def test_a_signing_secret_with_no_key_is_refused_and_an_empty_one_is_unset() -> None:
    # an empty HMAC key signs webhooks anyone could forge
    with pytest.raises(SettingsError, match=r"COSYQ_WEBHOOK_SECRET: .*no key after whsec_"):
        load_settings(env_file=None, webhook_secret="whsec_")
    # `COSYQ_WEBHOOK_SECRET=` is no secret at all: the dispatcher then refuses to start
    assert load_settings(env_file=None, webhook_secret="").webhook_secret is None


@pytest.mark.parametrize(
    "bad_line",
    [
        "COSYQ_REDIS_URL redis://:hunter2pw@10.0.0.9:6379/0",  # no "="
        'COSYQ_REDIS_URL="redis://:hunter2pw@10.0.0.9:6379/0',  # a quote never closed
    ],
)
def test_an_env_file_line_that_cannot_be_read_is_refused_unshown(
    tmp_path: Path, bad_line: str
) -> None:
    # python-dotenv skips such a line with a warning: the default Redis took its place
    env_file = tmp_path / "settings.env"
    env_file.write_text(f"COSYQ_LOG_LEVEL=INFO\n{bad_line}\n")
    with pytest.raises(SettingsError) as caught:
        load_settings(env_file=env_file)
    message = str(caught.value)
    assert f"the settings file {env_file} cannot be read at line 2" in message
    assert "hunter2pw" not in message and "10.0.0.9" not in message


def test_an_env_file_that_is_not_text_is_one_clear_error(tmp_path: Path) -> None:
    env_file = tmp_path / "binary.env"
    env_file.write_bytes(b"\xff\xfe\x00\x01COSYQ_X=\x9c\n")
    with pytest.raises(SettingsError, match="is not UTF-8 text"):
        load_settings(env_file=env_file)
