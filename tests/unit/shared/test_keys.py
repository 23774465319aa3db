"""Redis key helpers: priorities map to the three queues; idempotency keys are hashed."""

from __future__ import annotations

import hashlib

from shared import keys, tenants


def test_priorities_map_to_queues_in_listening_order() -> None:
    assert [keys.queue_for(p) for p in ("high", "default", "low")] == list(
        keys.QUEUES_IN_PRIORITY_ORDER
    )


def test_idempotency_key_is_hashed_under_the_prefix() -> None:
    raw = "order-42/line 7 with spaces and ünïcode"
    key = keys.idempotency_key(raw, "default")
    assert key == "cosyq:idem:" + hashlib.sha256(raw.encode()).hexdigest()  # as before tenants
    assert keys.idempotency_key("a", "default") != keys.idempotency_key("b", "default")


def test_idempotency_keys_are_per_tenant() -> None:
    digest = hashlib.sha256(b"order-42").hexdigest()
    assert keys.idempotency_key("order-42", "beta") == f"cosyq:idem:beta:{digest}"
    named = {keys.idempotency_key("order-42", t) for t in ("default", "alpha", "beta")}
    assert len(named) == 3
    assert keys.DEFAULT_TENANT == tenants.DEFAULT_TENANT


def test_per_name_keys() -> None:
    assert keys.voice_key("alice", "default") == "cosyq:voice:alice"  # as before tenants
    assert keys.voices_set("default") == "cosyq:voices"
    assert keys.voice_key("alice", "beta") == "cosyq:voice:beta:alice"
    assert keys.voices_set("beta") == "cosyq:voices:beta"
    assert keys.voice_key("alice", keys.SHARED_VOICES) == "cosyq:voice:_shared:alice"
    assert keys.job_heartbeat_key("j1") == "cosyq:job-heartbeat:j1"
    assert keys.worker_stats_key("w1") == "cosyq:worker-stats:w1"
