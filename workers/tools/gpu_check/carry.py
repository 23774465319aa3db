"""What the GPU machine lacks of a worker's dependencies: `python -m workers.tools.gpu_check.carry`
prints them as pinned requirements (this environment's versions), for `scripts/gpu-prepare`.

The GPU machine's image (`/work/.library/device/KINDS.md`, "Python packages already there",
read 2026-11-17) holds torch 2.11, numpy, scipy, onnxruntime, tokenizers and most of what a
worker imports; nothing can be installed there but carried wheels. The walk starts at
`cosyq[worker]`, follows each requirement this environment installed, and stops at packages the
image has (their own dependencies are the image's). The worker runs with the image's numpy
(2.5 there; our pin below 2.4 is for coremltools, which a GPU host never imports).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

from packaging.requirements import Requirement

IMAGE_PACKAGES = frozenset(
    """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
    jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator
    lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes
    mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals networkx
    ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging
    pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf
    psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest
    pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
    pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
    scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
    shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
    tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
    torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers
    treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig
    werkzeug wheel wrapt xarray xxhash yarl zipp""".split()  # noqa: SIM905 - the list as read
)


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_requirements(root: str = "cosyq", extras: tuple[str, ...] = ("worker",)) -> list[str]:
    """`name==version` for every installed dependency of `root[extras]` the image lacks
    (`root` itself excluded: it travels as its own wheel)."""
    pinned: dict[str, str] = {}
    seen: set[str] = set()

    def walk(name: str, wanted: tuple[str, ...]) -> None:
        key = normalized(name)
        if key in seen or key in IMAGE_PACKAGES:
            return
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return  # an optional dependency this environment never installed
        if key != normalized(root):
            pinned[key] = dist.version
        for text in dist.requires or []:
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in ("", *wanted)):
                walk(requirement.name, tuple(requirement.extras))

    walk(root, extras)
    return [f"{name}=={version}" for name, version in sorted(pinned.items())]


if __name__ == "__main__":
    sys.stdout.write("".join(f"{line}\n" for line in missing_requirements()))
