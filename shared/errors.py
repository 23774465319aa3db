"""The error hierarchy shared by producer and workers.

Three kinds matter operationally: a bad request (permanent, never retried), a model that cannot
be loaded (start-up, the worker exits non-zero before taking a job), and a transient fault
(storage or Redis unreachable: retried with backoff). Code raises these with `from e`; only the
job boundary catches broadly.
"""

from __future__ import annotations


class CosyqError(Exception):
    """Base class for every error cosyq raises on purpose."""


class InvalidRequestError(CosyqError):
    """The request can never succeed as written (bad field, unknown voice, unreadable prompt)."""


class ModelLoadError(CosyqError):
    """A model directory, checkpoint or converted package is missing, corrupt or mismatched."""


class TransientError(CosyqError):
    """A fault outside the request that may pass (storage or Redis unreachable)."""
