"""The cache folders a worker writes, probed when `cosyq-worker run` and `pool` load settings.

A worker writes checkpoint hashes (`COSYQ_HASH_CACHE_DIR`), and with their features on
torch.compile's caches, the int8 LLM's graphs and compiled Core ML models. A folder it could
not write failed only where it first wrote: a PermissionError wrapped in the engine's load
error, after the 2.5 GB of checkpoints had been hashed. So each folder the settings will have
written is made if missing and probed with a file created and removed: one line naming the
setting, exit 2. A probe, not `os.access`: access(2) answers for the real user and says yes to
root whatever the folder's mode (an NFS export squashing root still refuses its writes).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from shared.errors import SettingsError
from shared.settings import Settings

# What a worker writes in each cache folder, for the message about one it cannot write.
CACHE_WRITES = {
    "hash_cache_dir": "checkpoint hashes",
    "compile_cache_dir": "torch.compile's caches",
    "ort_cache_dir": "the int8 LLM's built graphs",
    "coreml_cache_dir": "compiled Core ML models",
}


def worker_folders(settings: Settings, *, platform: str = sys.platform) -> list[str]:
    """The cache folder settings a worker with these settings writes at start: the hashes
    always, the others when their feature is on (int8 chosen by `auto` is checked once chosen,
    workers/service/default_engine.py)."""
    names = ["hash_cache_dir"]
    if settings.compile_decode:
        names.append("compile_cache_dir")
    if settings.llm_precision == "int8":
        names.append("ort_cache_dir")
    if platform == "darwin" and settings.backend != "torch":
        names.append("coreml_cache_dir")
    return names


def unwritable_folder(path: Path) -> str | None:
    """Why this process cannot write a file in `path` (made if missing), or None if it can."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".cosyq-probe-", dir=path)
    except OSError as e:
        return e.strerror or type(e).__name__
    os.close(handle)
    os.unlink(probe)
    return None


def unwritable_setting(name: str, path: Path) -> str | None:
    """What is wrong, naming the folder setting `name`, when this process cannot write `path`
    (`cosyq-worker doctor` shows it as its row's detail), else None."""
    why = unwritable_folder(path)
    if why is None:
        return None
    return (
        f"{setting_name(name)}={path} cannot be written by this process ({why}): a worker "
        f"keeps {CACHE_WRITES[name]} there"
    )


def setting_name(name: str) -> str:
    return f"COSYQ_{name.upper()}"


def check_writable(name: str, path: Path) -> None:
    """SettingsError (one line) when the folder setting `name` names a folder we cannot write."""
    said = unwritable_setting(name, path)
    if said is not None:
        setting = setting_name(name)
        raise SettingsError(f"{said}; make it writable or point {setting} elsewhere")


def check_worker_folders(settings: Settings, *, platform: str = sys.platform) -> None:
    """Probe each cache folder a worker with these settings writes (`worker_folders`)."""
    for name in worker_folders(settings, platform=platform):
        check_writable(name, getattr(settings, name))
