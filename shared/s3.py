"""S3 access for storage: a boto3 client made on first use, and errors mapped to ours.

Endpoint, region and keys come from settings when set, else from boto3's usual chain (AWS_*
variables, ~/.aws, instance roles), so AWS, MinIO and R2 all work. boto3 is the `cosyq[s3]` extra:
it is imported only when an s3:// URI is actually used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shared.errors import (
    CosyqError,
    InvalidRequestError,
    ObjectNotFoundError,
    StorageError,
    StorageUnavailableError,
)
from shared.settings import Settings
from shared.settings_env import redact_urls

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchBucket", "404", "NotFound"})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
    }
)
# What the usual permanent codes mean, in the words an operator needs.
_CAUSES = {
    "NoSuchBucket": "no such bucket",
    "AccessDenied": "access denied",
    "AllAccessDisabled": "access denied",
    "InvalidAccessKeyId": "the access key id is not known (wrong credentials)",
    "SignatureDoesNotMatch": "the secret key does not match (wrong credentials)",
    "InvalidBucketName": "invalid bucket name",
    "PermanentRedirect": "the bucket is in another region (set COSYQ_S3_REGION)",
    "AuthorizationHeaderMalformed": "wrong region for this bucket (set COSYQ_S3_REGION)",
    "403": "access denied or wrong credentials",
}


class S3Access:
    """get/put of whole objects with one lazily created client."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client: Any = None

    def client(self) -> Any:
        if self._client is None:
            self._client = make_s3_client(self._settings)
        return self._client

    def put(
        self,
        bucket: str,
        key: str,
        data: bytes,
        *,
        content_type: str,
        metadata: dict[str, str],
        uri: str,
    ) -> None:
        try:
            self.client().put_object(
                Bucket=bucket, Key=key, Body=data, ContentType=content_type, Metadata=metadata
            )
        except Exception as e:
            raise _translate(e, uri, "write") from e

    def put_file(
        self,
        bucket: str,
        key: str,
        path: Path,
        *,
        content_type: str,
        metadata: dict[str, str],
        uri: str,
    ) -> None:
        """A local file uploaded in parts (boto3's managed transfer): never whole in memory."""
        try:
            self.client().upload_file(
                str(path),
                bucket,
                key,
                ExtraArgs={"ContentType": content_type, "Metadata": metadata},
            )
        except Exception as e:
            raise _translate(e, uri, "write") from e

    def delete(self, bucket: str, key: str, uri: str) -> None:
        try:
            self.client().delete_object(Bucket=bucket, Key=key)
        except Exception as e:
            raise _translate(e, uri, "delete") from e

    def check_bucket(self, bucket: str, uri: str) -> None:
        """HEAD the bucket: it exists and these credentials may use it."""
        try:
            self.client().head_bucket(Bucket=bucket)
        except Exception as e:
            raise _translate(e, uri, "reach") from e

    def get(self, bucket: str, key: str, uri: str, max_bytes: int) -> bytes:
        try:
            response = self.client().get_object(Bucket=bucket, Key=key)
            body = response["Body"]
            size = int(response.get("ContentLength") or 0)
            if size > max_bytes:
                body.close()
                raise _TooLargeError(size)
            return bytes(body.read())
        except _TooLargeError as e:
            raise InvalidRequestError(
                f"{uri}: {e.size:,} bytes, limit {max_bytes:,} (COSYQ_MAX_READ_BYTES)"
            ) from e
        except Exception as e:
            raise _translate(e, uri, "read") from e

    def metadata(self, bucket: str, key: str, uri: str) -> dict[str, str]:
        """An object's user metadata (HEAD); ObjectNotFoundError when it is not there."""
        try:
            response = self.client().head_object(Bucket=bucket, Key=key)
            return dict(response.get("Metadata") or {})
        except Exception as e:
            raise _translate(e, uri, "read") from e

    def open(self, bucket: str, key: str, uri: str) -> tuple[Any, int, dict[str, str]]:
        """An object's streaming body (`iter_chunks`, `close`), its size and its user metadata,
        for relaying it without holding it in memory (the HTTP front's audio downloads)."""
        try:
            response = self.client().get_object(Bucket=bucket, Key=key)
            metadata = dict(response.get("Metadata") or {})
            return response["Body"], int(response.get("ContentLength") or 0), metadata
        except Exception as e:
            raise _translate(e, uri, "read") from e


class _TooLargeError(Exception):
    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


def make_s3_client(settings: Settings) -> Any:
    """A boto3 S3 client configured from settings (None values fall back to boto3's chain)."""
    try:
        import boto3  # noqa: PLC0415 (optional extra, imported on first S3 use)
        from botocore.config import Config  # noqa: PLC0415
    except ImportError as e:
        raise StorageError("s3:// storage needs boto3: pip install 'cosyq[s3]'") from e
    secret = settings.s3_secret_access_key
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        region_name=settings.s3_region,
        aws_access_key_id=settings.s3_access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        config=Config(
            s3={"addressing_style": settings.s3_addressing_style},
            retries={"mode": "standard", "max_attempts": settings.s3_max_attempts},
            connect_timeout=settings.s3_connect_timeout_s,
            read_timeout=settings.s3_read_timeout_s,
        ),
    )


def _translate(error: Exception, uri: str, action: str) -> CosyqError:
    """botocore's exceptions -> not found / unavailable / storage error, by code, not by text.

    A missing bucket is "not found" when reading (a prompt URI naming it is a bad request) but a
    storage error when writing (our own storage is misconfigured).
    """
    if isinstance(error, CosyqError):
        return error
    from botocore import exceptions as boto_errors  # noqa: PLC0415

    where = f"cannot {action} {uri}"
    said = redact_urls(str(error))  # botocore quotes the endpoint URL, userinfo and all
    if isinstance(error, boto_errors.ClientError):
        code = str(error.response.get("Error", {}).get("Code", ""))
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        cause = f"{_CAUSES[code]} ({code}, HTTP {status})" if code in _CAUSES else None
        if code in _NOT_FOUND_CODES and (action == "read" or code != "NoSuchBucket"):
            return ObjectNotFoundError(f"{uri}: not found ({code})")
        if code in _TRANSIENT_CODES or status >= 500:
            return StorageUnavailableError(f"{where}: {code} (HTTP {status})")
        return StorageError(f"{where}: {cause or f'{code} (HTTP {status})'}")
    if isinstance(error, boto_errors.NoCredentialsError | boto_errors.PartialCredentialsError):
        return StorageError(f"{where}: no S3 credentials ({said})")
    if isinstance(error, boto_errors.SSLError):
        return StorageError(f"{where}: TLS failed ({said})")
    transient = (
        boto_errors.ConnectionError,  # refused, connect timeout, proxy
        boto_errors.HTTPClientError,  # reset, read timeout, closed mid-response
        boto_errors.IncompleteReadError,
        ConnectionError,
        TimeoutError,
    )
    if isinstance(error, transient):
        return StorageUnavailableError(f"{where}: {said}")
    return StorageError(f"{where}: {type(error).__name__}: {said}")
