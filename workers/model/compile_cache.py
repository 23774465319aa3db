"""torch.compile's caches in one folder that outlives a worker (`COSYQ_COMPILE_CACHE_DIR`).

A recycled worker is a new process: without a kept cache it compiles everything again (tens of
seconds for the decode step). Inductor keeps compiled graphs on disk when its FX graph cache is
on (`TORCHINDUCTOR_FX_GRAPH_CACHE`, `TORCHINDUCTOR_AUTOGRAD_CACHE`) under
`TORCHINDUCTOR_CACHE_DIR`, and Triton its kernels under `TRITON_CACHE_DIR`. These are read from
the environment when Inductor is first imported (and the cache folders each time they are
used), so `use_compile_cache` runs before the model loads; a pool's workers inherit nothing
from each other but read the same folder.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from pathlib import Path


def compile_cache_env(directory: Path) -> dict[str, str]:
    """The variables that put every torch.compile cache under `directory`."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(directory),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "TRITON_CACHE_DIR": str(directory / "triton"),
    }


def use_compile_cache(
    directory: Path, *, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Create `directory` and point this process's compile caches at it (the setting wins over
    variables already set); the variables set. An Inductor already imported is switched too."""
    environ = os.environ if environ is None else environ
    directory.mkdir(parents=True, exist_ok=True)
    values = compile_cache_env(directory)
    environ.update(values)
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None and environ is os.environ:
        inductor_config.fx_graph_cache = True  # type: ignore[attr-defined]
        inductor_config.autograd_cache = True  # type: ignore[attr-defined]
    return values
