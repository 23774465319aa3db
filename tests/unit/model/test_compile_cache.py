"""torch.compile's caches in `COSYQ_COMPILE_CACHE_DIR`: a second process finds the first's work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.model.compile_cache import use_compile_cache

# One process: point the caches at argv[1], compile a small function on the CPU, print whether
# Inductor's FX graph cache hit (counters are per process).
COMPILE_ONCE = """
import sys
from pathlib import Path
from workers.model.compile_cache import use_compile_cache
use_compile_cache(Path(sys.argv[1]))
import torch
from torch._dynamo.utils import counters
f = torch.compile(lambda x: (x * 2).sin() + 1, dynamic=False)
f(torch.ones(8))
print("hit" if counters["inductor"]["fxgraph_cache_hit"] else "miss")
"""


def test_the_variables_point_every_cache_at_the_folder(tmp_path: Path) -> None:
    environ: dict[str, str] = {"TORCHINDUCTOR_CACHE_DIR": "/elsewhere"}
    folder = tmp_path / "inductor"
    values = use_compile_cache(folder, environ=environ)
    assert folder.is_dir()
    assert environ == values
    assert values == {
        "TORCHINDUCTOR_CACHE_DIR": str(folder),
        "TORCHINDUCTOR_FX_GRAPH_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_CACHE": "1",
        "TRITON_CACHE_DIR": str(folder / "triton"),
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_process_reads_the_first_ones_compiled_graph(tmp_path: Path) -> None:
    """What a recycled worker relies on: the first process compiles (a miss), the next one
    hits the kept graph in the same folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR", "TRITON"))}
    # What is kept is the point, not how fast or how wide the kernel is: compile in this process
    # (no pool of compile workers to start) and as scalar C++ (no dry compile per vector ISA),
    # 22 s -> 12 s for the first process on the 2-core host.
    env |= {"TORCHINDUCTOR_COMPILE_THREADS": "1", "TORCHINDUCTOR_VEC_ISA_OK": "0"}
    # Nor a precompiled header of torch's includes (131 MB, built once per machine in the
    # default temporary folder, outside the folder kept: a fresh CI machine built it every
    # run) for one small kernel.
    env["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] = "0"
    folder = tmp_path / "kept"

    def run() -> str:
        done = subprocess.run(
            [sys.executable, "-c", COMPILE_ONCE, str(folder)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=True,
        )
        return done.stdout.strip().splitlines()[-1]

    assert run() == "miss"
    assert run() == "hit"
