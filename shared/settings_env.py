"""What `Settings` reads besides its own fields: `.env` files, every `COSYQ_*` name refused that
is not a setting (pydantic-settings would ignore a typo), and URLs shown without passwords."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from dotenv import dotenv_values
from dotenv.parser import parse_stream

from shared.errors import SettingsError
from shared.sentinel import SENTINEL_SCHEME, parse_sentinel_url

ENV_PREFIX = "COSYQ_"
# COSYQ_ variables that are not settings: read by scripts/ and the test harness only.
NON_SETTINGS_VARIABLES = frozenset(
    {
        "COSYQ_PYTHON",  # scripts/env.sh: the interpreter that creates .venv
        "COSYQ_REFERENCE_DIR",  # tests: the CosyVoice 2 reference set
        "COSYQ_REFERENCE3_DIR",  # tests: the CosyVoice 3 reference set
        "COSYQ_REQUIRE_REFERENCE",  # tests/CI: fail (not skip) when the reference set is missing
    }
)


# Query parameters that carry a credential (redis-py reads ?password=; S3 presigned URLs sign)
_SECRET_QUERY = re.compile(
    r"(?i)([?&;][a-z0-9_.-]*(?:pass|pwd|secret|token|key|credential|signature|auth)[a-z0-9_.-]*=)"
    r"[^&;#\s'\"]*"
)
_BRACKETED = re.compile(r"\[[^\]]*\]")  # an IPv6 address's colons are not a password's
# A URL in a text: up to a space or quote, or a comma that starts the next URL of a list
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:(?!,[A-Za-z][A-Za-z0-9+.-]*://)[^\s'\"])*")

REDIS_SCHEMES = ("redis", "rediss", "unix", SENTINEL_SCHEME)


def check_redis_url(value: str) -> str:
    """COSYQ_REDIS_URL's shape; a ValueError names the part that is wrong, never quoting it (a
    misplaced password would be in it). urlsplit's own "Invalid IPv6 URL" quotes nothing."""
    if not value.strip():
        raise ValueError("is empty: unset it for the default redis://127.0.0.1:6379/0")
    parts = urlsplit(value)
    if parts.scheme not in REDIS_SCHEMES:
        raise ValueError(f"scheme must be one of {', '.join(REDIS_SCHEMES)} (got {parts.scheme!r})")
    _check_password_delimiters(value)
    if parts.scheme == SENTINEL_SCHEME:
        parse_sentinel_url(value)  # a ValueError names the part that is wrong
    elif parts.scheme != "unix":
        _check_port(parts)
        if parts.path.strip("/") and not parts.path.strip("/").isdigit():
            raise ValueError("the database after the host must be a number: redis://host/0")
    return value


def _check_password_delimiters(value: str) -> None:
    """urlsplit, and redis-py with it, ends user:password at a raw '/', '?' or '#': the rest of
    such a password would be taken for the host, port or path, and quoted by redis-py's errors."""
    if _userinfo_end(value.partition("://")[2]) >= 0:
        raise ValueError(
            "a '/', '?' or '#' in the password must be percent-encoded (%2F, %3F, %23)"
        )


def _userinfo_end(rest: str) -> int:
    """The '@' that ends the user:password of `rest` (a URL after its `scheme://`) when a raw
    '/', '?' or '#' in the password cut it short (an '@' after the cut, outside a query value,
    with a ':' before it); -1 when none did."""
    cut = _authority_end(rest, 0)
    if ":" not in rest[:cut] or rest[:cut].endswith("@"):
        return -1
    head, mark, query = rest[cut:].partition("?")
    return rest.rfind("@", cut, cut + len(head) + len(mark) + len(query.split("=", 1)[0]))


def _check_port(parts: SplitResult) -> None:
    """urlsplit's own error quotes the port's text: with the '@' forgotten, the password."""
    try:
        _ = parts.port
    except ValueError:
        raise ValueError("the port must be a number from 1 to 65535") from None


def redact_url(url: str, *, keep_user: bool = True, keep_query: bool = True) -> str:
    """A URL fit to show: its password (user:secret@, or a lone secret@; a user's even with a raw
    '/', '?', '#' or '@' in it) and any credential in its query replaced by ***; the user name
    before a ':' stays for the operator's eyes (not with `keep_user=False`: an answer to
    anyone). `keep_query=False`: every query value is ***
    (a tenant's webhook URL, whose token may go by any name: Azure's ?code=). Never raises,
    whatever the text (urlsplit refuses some URLs, and a refused URL is the one most worth
    showing safely)."""
    if not keep_query:
        url = _without_query_values(url)
    scheme, sep, rest = url.partition("://")
    if not sep:  # no scheme (forgotten): anything before an '@' may be user:password
        userinfo, at, hosts = url.rpartition("@")
        if at:
            user, colon, _ = userinfo.partition(":")
            url = (f"{user}:***" if colon and keep_user else "***") + "@" + hosts
        return _SECRET_QUERY.sub(r"\1***", url)
    cut = _authority_end(rest, 0)
    if (userinfo_end := _userinfo_end(rest)) >= 0:  # a raw '/', '?' or '#' in the password
        cut = _authority_end(rest, userinfo_end)
    authority, tail = rest[:cut], rest[cut:]
    userinfo, at, hosts = authority.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        authority = (f"{user}:***" if colon and keep_user else "***") + "@" + hosts
    elif any(_BRACKETED.sub("", host).count(":") > 1 for host in authority.split(",")):
        authority = "***"  # user:secret:host:port, the '@' forgotten: no telling which is which
    return scheme + sep + authority + _SECRET_QUERY.sub(r"\1***", tail)


def _authority_end(rest: str, start: int) -> int:
    """Where the authority of `rest` (a URL after its `scheme://`) ends, looking from `start`."""
    found = (i for i in (rest.find(c, start) for c in "/?#") if i >= 0)
    return min(found, default=len(rest))


def _without_query_values(url: str) -> str:
    """`url` with each value of its query (and the fragment after it) replaced by ***."""
    head, mark, query = url.partition("?")
    if not mark:
        return url
    items = (item.partition("=") for item in query.split("&"))
    return head + mark + "&".join(f"{name}=***" if eq else name and "***" for name, eq, _ in items)


def redact_urls(text: str, *, keep_user: bool = True) -> str:
    """`text` with every URL in it passed through `redact_url` (an error message, say)."""
    return _URL_IN_TEXT.sub(lambda found: redact_url(found.group(0), keep_user=keep_user), text)


def read_env_files(env_file: Any) -> dict[str, str]:
    files: Iterable[Any]
    if env_file is None:
        files = ()
    elif isinstance(env_file, (str, Path)):
        files = (env_file,)
    else:
        files = env_file
    found: dict[str, str] = {}
    for file in files:
        if Path(file).is_file():
            refuse_unreadable_lines(Path(file))
            found.update({k: v or "" for k, v in dotenv_values(file).items()})
    return found


def refuse_unreadable_lines(file: Path) -> None:
    """A settings file line python-dotenv cannot parse is refused, not skipped (it only warns,
    and a skipped `COSYQ_REDIS_URL` line left the default Redis in its place). The line's text
    is not shown: it may hold a password."""
    with file.open(encoding="utf-8") as stream:
        bad = [binding.original.line for binding in parse_stream(stream) if binding.error]
    if bad:
        where = ("line " if len(bad) == 1 else "lines ") + ", ".join(str(n) for n in bad)
        raise SettingsError(
            f"the settings file {file} cannot be read at {where}: each line must be "
            "NAME=value (a quoted value closed on its line or a later one), a comment or blank"
        )


def reject_unknown_variables(
    environ: Mapping[str, str], dotenv: Mapping[str, str], *, known: set[str]
) -> None:
    """Every COSYQ_ name that is not a setting (`known`) refused, with the closest suggested."""
    problems = []
    for source, names in (("environment", environ), (".env file", dotenv)):
        for name in sorted(names):
            upper = name.upper()
            if not upper.startswith(ENV_PREFIX) or upper in known:
                continue
            if upper in NON_SETTINGS_VARIABLES:
                continue
            close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(f"unknown setting {name} (from the {source}){hint}")
    if problems:
        raise SettingsError(
            "; ".join(problems) + " (README.md, Configuration, lists every setting)"
        )
