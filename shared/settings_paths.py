"""The folder settings' shape, checked at load: `COSYQ_MODEL_DIR`, `COSYQ_COREML_DIR` and the
cache folders (`COSYQ_*_CACHE_DIR`).

Why: pydantic reads an empty value as `Path("")`, the current folder (`COSYQ_MODEL_DIR=` from
a shell variable that was unset: the worker then said the folder it was started in is no model);
a `.env` line's `~` is not the shell's, so `~/models` was a folder named `~` under the current
one; and a file where a folder goes was met only when the worker first wrote there, as a bare
`FileExistsError` after the model had loaded. So an empty value is refused (never read as the
current folder, nor as unset: it is most often a variable that was meant to hold something), a
leading `~` is the home folder, a relative path is made absolute against the folder the process
starts in (later messages name the real place), and a path that is a file, or lies under one,
is refused. Whether the folder exists is the worker's business (a producer's host has no model).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# Each folder setting and what unsetting it means, for the message about an empty value.
FOLDER_FIELDS = {
    "model_dir": "name the model's folder",
    "coreml_dir": "unset it for <COSYQ_MODEL_DIR>/coreml",
    "coreml_cache_dir": "unset it for ~/.cache/cosyq/coreml",
    "hash_cache_dir": "unset it for ~/.cache/cosyq/hashes",
    "compile_cache_dir": "unset it for ~/.cache/cosyq/inductor",
    "ort_cache_dir": "unset it for ~/.cache/cosyq/onnx",
}


def check_folder(name: str, value: Any) -> Any:
    """A folder setting's value made absolute; a ValueError for an empty one or a file."""
    if value is None:
        return None
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"is empty: {FOLDER_FIELDS[name]}")
    if not isinstance(value, str | os.PathLike):
        return value  # pydantic's own check says what is wrong
    path = Path(os.path.abspath(Path(value).expanduser()))
    for place in (path, *path.parents):
        try:
            if not place.exists():
                continue
            folder = place.is_dir()
        except OSError:  # not ours to read: the worker's own use says more
            break
        if not folder:
            where = "is a file" if place == path else f"lies under the file {place}"
            raise ValueError(f"{where}, not a folder")
        break
    return path
