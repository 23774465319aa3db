"""`redis+sentinel://` URLs: parsing, settings errors, and the client they build."""

from __future__ import annotations

import pytest
from redis.sentinel import SentinelConnectionPool

from shared.connection import redis_connection
from shared.errors import SettingsError
from shared.sentinel import SentinelAddress, parse_sentinel_url
from shared.settings import load_settings


def test_hosts_credentials_service_and_db() -> None:
    address = parse_sentinel_url("redis+sentinel://al%40ice:p%3Ass@s1:26380,s2,[::1]:5/main/3")
    assert address == SentinelAddress(
        sentinels=(("s1", 26380), ("s2", 26379), ("::1", 5)),
        service_name="main",
        db=3,
        username="al@ice",
        password="p:ss",
    )


def test_db_defaults_to_zero_and_password_alone_is_allowed() -> None:
    address = parse_sentinel_url("redis+sentinel://:secret@10.0.0.1:26379/cosyq")
    assert (address.db, address.username, address.password) == (0, None, "secret")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://s1:26379", "needs a service name"),
        ("redis+sentinel://s1:26379/", "needs a service name"),
        ("redis+sentinel://s1:26379/a/b/c", "needs a service name"),
        ("redis+sentinel://s1:26379/main/x", "the database must be a number"),
        ("redis+sentinel://s1:port/main", "bad sentinel port [(]host 1[)]"),
        ("redis+sentinel://s1:70000/main", "bad sentinel port"),
        ("redis+sentinel://s1,,s2/main", "an empty sentinel address"),
        ("redis+sentinel://:26379/main", "without a host"),
        ("redis+sentinel://s1/main?ssl=1", "no ?query"),
    ],
)
def test_malformed_urls_say_which_part_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("?", r"\?")):
        parse_sentinel_url(url)


def test_a_bad_sentinel_url_is_one_settings_error_without_the_password() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(env_file=None, redis_url="redis+sentinel://u:hunter2@s1:x/main")
    text = str(caught.value)
    assert "COSYQ_REDIS_URL" in text and "bad sentinel port" in text
    assert "hunter2" not in text and "u:***@" in text


def test_the_client_follows_the_service_through_its_sentinels() -> None:
    settings = load_settings(
        env_file=None,
        redis_url="redis+sentinel://u:pw@127.0.0.1:1,127.0.0.1:2/main/4",
        redis_connect_timeout_s=0.5,
    )
    client = redis_connection(settings)
    pool = client.connection_pool
    assert isinstance(pool, SentinelConnectionPool)
    assert pool.service_name == "main"
    assert pool.connection_kwargs["db"] == 4
    assert pool.connection_kwargs["username"] == "u"
    assert pool.connection_kwargs["password"] == "pw"
    assert pool.connection_kwargs["socket_connect_timeout"] == 0.5
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [1, 2]
    assert settings.redacted_redis_url() == "redis+sentinel://u:***@127.0.0.1:1,127.0.0.1:2/main/4"


def test_wait_timeout_must_fit_inside_the_housekeeping_read_timeout() -> None:
    with pytest.raises(SettingsError, match="redis_wait_timeout_s must be shorter"):
        load_settings(
            env_file=None, redis_wait_replicas=1, redis_wait_timeout_s=5, heartbeat_ttl_s=10
        )
