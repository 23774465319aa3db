"""Who is looking at the page: a bearer key (scripts) or a signed-in browser's session.

Signing in posts the key once in a form; the answer sets a cookie holding a random session id
(HttpOnly, Secure, SameSite=Strict; never the key). Redis keeps `sha256(id)` -> the caller's
tenant, whether an operator key, the name given at sign-in, the session's CSRF token and the
key's digest (`auth.key_digest`: the session ends when its key leaves the settings), for
COSYQ_UI_SESSION_TTL_S. Every state-changing form carries that token; a bearer caller (no
cookie: nothing ambient a foreign page could ride on) needs none.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import asdict, dataclass

import redis

from shared.keys import UI_SESSION_PREFIX

COOKIE = "cosyq_ui"
NAME_RE = re.compile(r"[\w .@-]{0,40}")  # the optional name a person gives at sign-in


@dataclass(frozen=True)
class Caller:
    """The signed-in person or script: its tenant, operator rights, and how judgements name it."""

    tenant: str
    operator: bool
    name: str  # what the sign-in form said, else "" (judgements name tenant and role too)
    csrf: str | None  # None: a bearer caller (no cookie, no token needed)
    key_digest: str = ""  # a session's: the digest of the key that opened it

    @property
    def who(self) -> str:
        """How a judgement names its author: never the key."""
        role = "operator" if self.operator else f"tenant {self.tenant}"
        return f"{self.name} ({role})" if self.name else role


def clean_name(raw: str) -> str:
    """The sign-in name, or "" when it holds anything but letters, digits, ' .@-'."""
    name = raw.strip()
    return name if NAME_RE.fullmatch(name) else ""


def _key(session_id: str) -> str:
    return UI_SESSION_PREFIX + hashlib.sha256(session_id.encode()).hexdigest()


def open_session(
    connection: redis.Redis,
    *,
    tenant: str,
    operator: bool,
    name: str,
    ttl_s: int,
    key_digest: str,
) -> str:
    """A new session; its id (the cookie's value)."""
    session_id = secrets.token_urlsafe(32)
    caller = Caller(tenant, operator, name, secrets.token_urlsafe(24), key_digest)
    connection.set(_key(session_id), json.dumps(asdict(caller)), ex=ttl_s)
    return session_id


def read_session(connection: redis.Redis, session_id: str) -> Caller | None:
    if not session_id or len(session_id) > 100:
        return None
    raw = connection.get(_key(session_id))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return Caller(
            tenant=str(data["tenant"]),
            operator=data["operator"] is True,
            name=str(data.get("name") or ""),
            csrf=str(data["csrf"]),
            key_digest=str(data.get("key_digest") or ""),
        )
    except (ValueError, KeyError, TypeError):
        return None


def close_session(connection: redis.Redis, session_id: str) -> None:
    if session_id and len(session_id) <= 100:
        connection.delete(_key(session_id))


def csrf_ok(caller: Caller, given: str | None) -> bool:
    """A cookie caller's form must carry its session's token; a bearer caller needs none."""
    if caller.csrf is None:
        return True
    return given is not None and hmac.compare_digest(given.encode(), caller.csrf.encode())
