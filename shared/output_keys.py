"""Where a tenant's audio may be written: the one place an output key is scoped to a tenant.

Every tenant writes under its own prefix of the storage root: `tenants/<tenant>/` for a named
tenant, none for "default", whose keys keep the layout from before tenants. Under a prefix, a
request's `output_key` is placed as given (`orders/42.wav` of tenant beta lands at
`tenants/beta/orders/42.wav`) and the automatic key is `<yyyy>/<mm>/<dd>/<job id>.<ext>`.

Some first segments are reserved, for every tenant: `tenants` (the other tenants' prefixes),
`voices` (uploaded recordings) and `documents` (a document's segments and assembled file, which
the producer names itself). A request naming one is refused, by the producer
(`place_output_key`) and again by the worker (`check_tenant_key`), which also refuses a key
outside the job's tenant prefix. The one key a job may have in a reserved area is its own
document segment's, the one its job's `cosyq_document` meta names. A document's assembler
checks the keys its plan names the same way (`check_document_keys`) before it writes or
deletes anything: each segment's its own, the file's in the document's own folder or where the
tenant's requests may write.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from shared.documents import DOCUMENT_PREFIX, document_folder, segment_key
from shared.errors import InvalidRequestError
from shared.jobs import check_output_key
from shared.tenants import DEFAULT_TENANT

TENANTS_AREA = "tenants"  # + "/<tenant>/": a named tenant's prefix
RESERVED_AREAS = (TENANTS_AREA, "voices", "documents")  # first segments no request may name


def reserved_area(key: str) -> str | None:
    """The reserved area `key`'s first segment names, in any case (`Tenants/` is `tenants/` on
    a case-insensitive file system: macOS's and Windows' default) and with any trailing dots
    (Windows drops them from a path's names: `tenants./` is `tenants/` there); None for any
    other key."""
    area = key.split("/", 1)[0]
    return area if area.rstrip(".").casefold() in RESERVED_AREAS else None


def tenant_prefix(tenant: str) -> str:
    """The prefix under which every key of `tenant` lies ("" for the default tenant)."""
    return "" if tenant == DEFAULT_TENANT else f"{TENANTS_AREA}/{tenant}/"


def owns_key(tenant: str | None, key: str) -> bool:
    """Whether the stored `key` (relative to the storage root, as read) lies in what `tenant`
    owns: under its prefix, outside the reserved areas but its own documents' (the default
    tenant's are the root's `documents/`, a named tenant's under its prefix). The front's
    check before it relays a result's file. A job or document of nobody's (None) is read by an
    operator key only, which reads every tenant's: any key."""
    if tenant is None:
        return True
    prefix = tenant_prefix(tenant)
    if not key.startswith(prefix):
        return False
    return reserved_area(key[len(prefix) :]) in (None, DOCUMENT_PREFIX)


def place_output_key(tenant: str, key: str, limit: int) -> str:
    """A request's output_key under its tenant's prefix; ValueError naming the rule when it
    names a reserved area or is too long once placed (the producer's check)."""
    area = reserved_area(key)
    if area is not None:
        raise ValueError(
            f"'{area}/' is reserved ({', '.join(a + '/' for a in RESERVED_AREAS)}): keys are "
            f"placed under the tenant's own prefix ({tenant_prefix(tenant) or 'the root'})"
        )
    placed = tenant_prefix(tenant) + key
    if len(placed) > limit:
        raise ValueError(f"{len(placed):,} characters with the tenant prefix, limit {limit:,}")
    return check_output_key(placed, limit)


def check_tenant_key(
    tenant: str, key: str | None, document: tuple[str, int] | None = None
) -> str | None:
    """The key if a job of `tenant` may write it (the worker's check; None stays None).

    InvalidRequestError when it lies outside the tenant's prefix or in a reserved area, unless
    it is exactly the key of the document segment the job is (`document`: id, index).
    """
    if key is None:
        return None
    prefix = tenant_prefix(tenant)
    if document is not None and key == prefix + segment_key(*document):
        return key
    if not key.startswith(prefix):
        raise InvalidRequestError(
            f"output_key: {key!r} is outside tenant {tenant}'s prefix {prefix!r}"
        )
    area = reserved_area(key[len(prefix) :])
    if area is not None:
        raise InvalidRequestError(f"output_key: {key!r} names the reserved area '{area}/'")
    return key


def check_document_keys(
    tenant: str, document_id: str, output_key: str, segments: Iterable[tuple[int, str]]
) -> None:
    """The assembler's check of a plan's keys, for a document of `tenant`: each segment's key
    (index, key) is exactly its own, and the file's (`output_key`, without extension) lies in
    the document's own folder or is one the tenant's requests may name. InvalidRequestError
    naming the first key that is not."""
    prefix = tenant_prefix(tenant)
    for index, key in segments:
        if key != prefix + segment_key(document_id, index):
            raise InvalidRequestError(
                f"document {document_id}: segment {index}'s key {key!r} is not its own "
                f"under tenant {tenant}'s prefix {prefix!r}"
            )
    try:
        check_output_key(output_key, limit=1024)
        if not output_key.startswith(prefix + document_folder(document_id)):
            check_tenant_key(tenant, output_key)
    except (ValueError, InvalidRequestError) as e:
        raise InvalidRequestError(f"document {document_id}: file key {output_key!r}: {e}") from e


def automatic_key(tenant: str, job_id: str, ext: str, when: datetime) -> str:
    """A job's key when its request names none: `<prefix><yyyy>/<mm>/<dd>/<job id>.<ext>`."""
    return f"{tenant_prefix(tenant)}{when:%Y/%m/%d}/{job_id}.{ext}"
