"""Comparing our stage outputs with the official reference arrays.

`check-reference` prints one `ArrayCheck` per array. Log features near their floors cannot be
matched tightly (see the reference README), so a check may be restricted to a mask of entries
and paired with a looser all-entries check. Rows that pass through a different resampler than
upstream's are reported with `gated=False`: printed for information, never failing the run.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch

REFERENCE_ARRAY_FILES = (
    "llm_reference.npz",
    "flow_reference.npz",
    "hift_reference.npz",
    "mel_reference.npz",
)


@dataclass(frozen=True)
class ArrayCheck:
    """One compared array: its worst absolute error against the tolerance it must meet."""

    name: str
    max_abs_error: float
    tolerance: float
    gated: bool = True
    detail: str = ""

    @property
    def passed(self) -> bool:
        within = math.isfinite(self.max_abs_error) and self.max_abs_error <= self.tolerance
        return within or not self.gated


def _as_numpy(x: np.ndarray | torch.Tensor) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def compare(
    name: str,
    ours: np.ndarray | torch.Tensor,
    reference: np.ndarray | torch.Tensor,
    tolerance: float,
    *,
    where: np.ndarray | None = None,
    gated: bool = True,
    detail: str = "",
) -> ArrayCheck:
    """Max |ours - reference| (over `where` if given); a shape mismatch is an infinite error."""
    a, b = _as_numpy(ours), _as_numpy(reference)
    if a.shape != b.shape:
        return ArrayCheck(name, math.inf, tolerance, gated, f"shape {a.shape} != {b.shape}")
    diff = np.abs(a - b)
    if where is not None:
        diff = diff[np.broadcast_to(where, diff.shape)]
    worst = float(diff.max()) if diff.size else 0.0
    if np.isnan(diff).any():
        worst = math.inf
    return ArrayCheck(name, worst, tolerance, gated, detail)


class ReferenceSet:
    """A folder in the format of `cosyvoice2-reference/`: config.json, checkpoints, npz arrays."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    @cached_property
    def config(self) -> dict[str, Any]:
        return json.loads((self.root / "config.json").read_text())

    def arrays(self, file_name: str) -> dict[str, np.ndarray]:
        with np.load(self.root / file_name) as data:
            return {k: data[k] for k in data.files}

    def has(self, file_name: str) -> bool:
        return (self.root / file_name).is_file()

    def checkpoint(self, stage: str) -> Path:
        return self.root / f"{stage}.pt"


KeyRow = tuple[str, str, str]  # key, shape like "151936x896" ("" for a scalar), dtype


def read_key_list(path: Path) -> list[KeyRow]:
    """A reference set's `key<TAB>shape<TAB>dtype` listing, in file order."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            key, shape, dtype = line.split("\t")
            rows.append((key, shape, dtype))
    return rows


def describe_state(state: dict[str, torch.Tensor]) -> list[KeyRow]:
    """Our state dict as key-list rows (works on meta tensors: no memory)."""
    return [
        (key, "x".join(str(n) for n in value.shape), str(value.dtype).removeprefix("torch."))
        for key, value in state.items()
    ]


def key_list_differences(ours: list[KeyRow], listed: list[KeyRow], listing: str) -> list[str]:
    """Missing, extra, re-shaped or re-typed keys and order changes; [] means equal."""
    mine, theirs = {k: (s, d) for k, s, d in ours}, {k: (s, d) for k, s, d in listed}
    problems = [f"missing from ours (in {listing}): {k}" for k in theirs if k not in mine]
    problems += [f"extra in ours (not in {listing}): {k}" for k in mine if k not in theirs]
    problems += [
        f"{k}: ours {'/'.join(mine[k])} != {listing} {'/'.join(theirs[k])}"
        for k in theirs
        if k in mine and mine[k] != theirs[k]
    ]
    if not problems and [k for k, *_ in ours] != [k for k, *_ in listed]:
        problems.append(f"same keys as {listing} but in a different order")
    return problems
