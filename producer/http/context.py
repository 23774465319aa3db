"""What the routes share: settings, one `CosyqClient`, an asyncio Redis client, the storage.

Submitting and status reads go through the same `CosyqClient` as every Python producer (run in
the thread pool: it is synchronous). Waiting is asyncio: a request that waits for its job, or
relays its stream, holds no thread, only a Redis connection blocked in XREAD.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Annotated, Any

import redis
import redis.asyncio as aioredis
from fastapi import Depends, Header, Request
from rq.job import Job
from rq.results import Result

from producer.client import CosyqClient
from producer.http.errors import ApiError
from producer.http.waits import Waits, pool_size
from producer.quotas import AuthFailures, RequestQuota
from producer.tracking import TERMINAL_STATES
from shared.connection import async_redis_connection
from shared.errors import JobNotFoundError, ResultTimeoutError
from shared.s3 import S3Access
from shared.settings import Settings
from shared.storage import Storage, open_storage

WAKE_EVERY_S = 1.0  # re-read the state at least this often (a reaped job writes no result)


def async_redis(settings: Settings) -> aioredis.Redis:
    """The asyncio twin of shared.connection.redis_connection (same URL and timeouts), its pool
    sized for every wait and the rest (producer/http/waits.py)."""
    return async_redis_connection(settings, max_connections=pool_size(settings))


@dataclass
class FrontContext:
    settings: Settings
    client: CosyqClient
    aredis: aioredis.Redis
    storage: Storage
    s3: S3Access  # one boto3 client, made on first use, for relaying S3 objects
    quota: RequestQuota  # each tenant's requests per minute (producer/quotas.py)
    auth_failures: AuthFailures  # each client address's wrong keys per minute (same module)
    waits: Waits  # the requests this process holds waiting, per tenant (shared by every copy)
    operator: bool = False  # the request came with an operator key (producer/http/auth.py)

    @classmethod
    def create(cls, settings: Settings, client: CosyqClient | None = None) -> FrontContext:
        client = client if client is not None else CosyqClient(settings)
        return cls(
            settings=settings,
            client=client,
            aredis=async_redis(settings),
            storage=open_storage(settings),
            s3=S3Access(settings),
            quota=RequestQuota(client.connection, settings),
            auth_failures=AuthFailures(client.connection, settings),
            waits=Waits(settings),
        )

    def for_tenant(self, tenant: str, *, operator: bool = False) -> FrontContext:
        """The same context, its client submitting as `tenant` (the request's key's)."""
        if tenant == self.client.tenant and operator == self.operator:
            return self
        return dataclasses.replace(self, client=self.client.for_tenant(tenant), operator=operator)

    def may_read(self, tenant: str | None) -> bool:
        """Whether this request may see what `tenant` owns: its own tenant's, or any for an
        operator key. Something with no tenant (None) belongs to nobody: operators only."""
        return self.operator or (tenant is not None and tenant == self.client.tenant)

    def check_may_change(self, tenant: str | None, what: str) -> None:
        """Cancelling is the owner's alone: an operator key reads another tenant's `what` but
        may not change it (403); a tenant key never gets here for another's (404 first)."""
        if tenant is None or tenant != self.client.tenant:
            raise ApiError(
                403,
                f"{what}: an operator key reads other tenants' {what}s but does not change them",
                code="not_owner",
                type_="permission_error",
            )

    async def close(self) -> None:
        await self.aredis.aclose()
        self.client.close()

    @property
    def connection(self) -> redis.Redis:
        return self.client.connection

    async def wait_until_done(self, job_id: str, timeout: float) -> str:
        """The job's terminal state, waiting up to `timeout` seconds.

        Blocks in XREAD on RQ's result stream (written in the same transaction as the final
        status), waking at least every WAKE_EVERY_S to re-read the state. Raises
        JobNotFoundError or ResultTimeoutError (naming the state it was left in).
        """
        deadline = time.monotonic() + timeout
        last_id: Any = b"0-0"
        stream = Result.get_key(job_id)
        while True:
            state: Any = await self.aredis.hget(Job.key_for(job_id), "status")
            if state is None:
                raise JobNotFoundError(f"no job {job_id} (never submitted, or expired)")
            text = state.decode() if isinstance(state, bytes) else str(state)
            if text in TERMINAL_STATES:
                return text
            left = deadline - time.monotonic()
            if left <= 0:
                raise ResultTimeoutError(f"job {job_id} is {text} after {timeout:g} s")
            block_ms = max(1, int(1000 * min(left, WAKE_EVERY_S)))
            replies: Any = await self.aredis.xread({stream: last_id}, block=block_ms, count=10)
            for _, entries in replies or ():
                if entries:
                    last_id = entries[-1][0]


def context_of(request: Request) -> FrontContext:
    """The front's context, bound to the tenant the key check found (producer/http/auth.py)."""
    context = request.app.state.cosyq
    assert isinstance(context, FrontContext)
    tenant = getattr(request.state, "tenant", None)
    operator = getattr(request.state, "operator", False) is True
    return context if tenant is None else context.for_tenant(tenant, operator=operator)


Context = Annotated[FrontContext, Depends(context_of)]  # a route's `context: Context`
# A cancel's `Idempotency-Key` header (DELETE /v1/jobs/{id}, /v1/documents/{id}): its retry
# answers as its first try did (producer/cancel.py)
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="a retry of a cancel with the same key answers as its first try did",
    ),
]
