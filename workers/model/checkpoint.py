"""Reading official CosyVoice 2 checkpoints safely and strictly.

Checkpoints are bare `state_dict`s saved with `torch.save`. We only ever read them with
`weights_only=True` (no arbitrary pickle), memory-mapped where the format allows so that loading
does not hold a second copy of the weights, and we load with strict semantics whose error names
the file and the offending keys instead of torch's generic message.
"""

from __future__ import annotations

import zipfile
from collections.abc import Collection, Mapping
from pathlib import Path

import torch
from torch import nn

from shared.errors import ModelLoadError
from workers.model.checkpoint_dtype import convert_state_dict

_MAX_NAMED_KEYS = 6


def read_state_dict(
    path: Path,
    *,
    mmap: bool = True,
    dtype: torch.dtype | None = None,
    keep: Collection[str] = (),
) -> dict[str, torch.Tensor]:
    """Return the tensors stored in `path`, raising `ModelLoadError` that names the file.

    With `dtype`, floating-point tensors (but those named in `keep`) come converted, one at a
    time, and a mapped file's pages are released as they are read: a bf16 model then never
    holds its fp32 bytes resident (see `checkpoint_dtype`).
    """
    if not path.is_file():
        raise ModelLoadError(f"{path}: file missing (expected a torch.save state_dict)")
    mmap = mmap and can_map(path)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # pickle errors, truncated zip, unsafe globals ...
        raise ModelLoadError(f"{path}: not a readable torch checkpoint ({e})") from e
    if not isinstance(obj, Mapping):
        raise ModelLoadError(f"{path}: expected a state_dict mapping, found {type(obj).__name__}")
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise ModelLoadError(f"{path}: entries that are not named tensors: {_names(bad)}")
    if dtype is not None:
        return convert_state_dict(obj, dtype, mapped=mmap, keep=keep)
    return dict(obj)


def can_map(path: Path) -> bool:
    """Whether `read_state_dict` can memory-map `path`: the legacy (non-zip) torch.save format
    cannot be, and is read into memory instead."""
    return zipfile.is_zipfile(path)


def _names(keys: list[str]) -> str:
    shown = ", ".join(str(k) for k in keys[:_MAX_NAMED_KEYS])
    more = len(keys) - _MAX_NAMED_KEYS
    return shown + (f" (+{more} more)" if more > 0 else "")


def check_keys_and_shapes(
    module: nn.Module, state: Mapping[str, torch.Tensor], *, source: Path | str
) -> None:
    """Raise `ModelLoadError` unless `state` has exactly the module's keys and shapes."""
    expected = module.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong = [
        f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing keys: {_names(missing)}")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected keys: {_names(unexpected)}")
    if wrong:
        problems.append(f"{len(wrong)} wrong shapes (file != model): {_names(wrong)}")
    if problems:
        raise ModelLoadError(
            f"{source}: does not match the model configuration; " + "; ".join(problems)
        )


def load_strict(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    source: Path | str,
    assign: bool = False,
) -> None:
    """Load `state` into `module` with strict semantics; `assign=True` for meta-built modules."""
    check_keys_and_shapes(module, state, source=source)
    module.load_state_dict(state, strict=True, assign=assign)
