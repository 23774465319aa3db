"""What a job function needs from its worker process: the loaded engine and its companions.

RQ calls job functions by dotted path with the job's JSON arguments only, so the worker installs
one `WorkerRuntime` after loading the model and the job functions read it. A job run anywhere
else (a stock RQ worker, a test calling the function bare) gets a clear error, not a model load.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.jobs import RequestLimits
from shared.prompt_uris import PromptRoots
from shared.settings import Settings
from shared.storage import Storage
from workers.engine.api import SynthesisEngine
from workers.voices.book import VoiceBook


@dataclass(frozen=True)
class WorkerRuntime:
    settings: Settings
    engine: SynthesisEngine
    storage: Storage
    voices: VoiceBook
    limits: RequestLimits
    worker_name: str
    worker_pid: int
    prompt_roots: PromptRoots  # where prompt_audio may be read from, built once per worker


def prompt_roots(settings: Settings) -> PromptRoots:
    """The worker's COSYQ_PROMPT_ROOTS (default: the model dir and the storage prefix)."""
    return PromptRoots.from_values(
        settings.prompt_roots, storage_url=settings.storage_url, model_dir=settings.model_dir
    )


_installed: WorkerRuntime | None = None


def install_runtime(runtime: WorkerRuntime | None) -> None:
    """Set (or clear, with None) this process's runtime; the worker calls it once per process."""
    global _installed  # noqa: PLW0603 - one loaded model per process is the point
    _installed = runtime


def current_runtime() -> WorkerRuntime:
    if _installed is None:
        raise RuntimeError(
            "no synthesis engine is loaded in this process: cosyq jobs run inside "
            "CosyqWorker (`cosyq-worker run` or `rq worker -w workers.worker.CosyqWorker`)"
        )
    return _installed
