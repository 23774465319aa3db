"""vox's side of `cosyq-worker bench vox`: its converted models (cached) and the voice file.

vox (`pip install vox-tts==0.19.5`, a C++ CosyVoice 2 engine; the `vox` on PyPI is another
project) converts the official release layout with `python -m vox.build_cosyvoice`. The models
are converted with `--no-clone`: vox's own cloning needs its CAM++ walker (real `campplus.onnx`
graphs only: the tiny and full-random stand-ins are refused) and the `s3tokenizer` package, and
the side-by-side wants both engines prompted identically anyway. So the voice vox speaks with is
written from cosyq's own `VoicePrompt` of the directory's prompt.wav (speech tokens, 24 kHz mel,
speaker embedding, transcript): the same prompt features reach both engines' LLMs.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from workers.engine.api import VoicePrompt

VOX_PIN = "vox-tts==0.19.5"
INSTALL_LINE = (
    f"cosyq-worker bench vox: vox is not installed: pip install {VOX_PIN} "
    "(a numpy-only wheel; the package named `vox` on PyPI is another project)"
)
# vox's converter: LLM precision name -> its arguments (the flow and HiFT stay f32 in both)
VOX_PRECISIONS = {"q8": ("--quant", "q8"), "bf16": ("--dtype", "bf16")}
KEYED_FILES = ("cosyvoice2.yaml", "llm.pt", "flow.pt", "hift.pt")
SAMPLES_PER_TOKEN = 960  # 25 speech tokens/s at 24 kHz: 2 mel frames x 480-sample hop


class VoxMissingError(RuntimeError):
    """`import vox` failed: the bench cannot run (its message says how to install vox)."""


class VoxConversionError(RuntimeError):
    """vox's converter exited non-zero (the message holds its command and its last lines)."""


def import_vox() -> ModuleType:
    try:
        import vox  # noqa: PLC0415  (optional: only this bench needs it)
    except ImportError as e:
        raise VoxMissingError(INSTALL_LINE) from e
    if not hasattr(vox, "Engine"):  # another project's `vox` module
        raise VoxMissingError(INSTALL_LINE)
    return vox


def vox_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("vox-tts")
    except PackageNotFoundError as e:
        raise VoxMissingError(INSTALL_LINE) from e


def cache_key(model_dir: Path, version: str) -> str:
    """Path, size and mtime of the weight files, and vox's version: a changed model or a new
    vox converts again (hashing 3 GB of weights on every run would cost more than it saves)."""
    root = model_dir.resolve()
    parts = [version, str(root)]
    for name in KEYED_FILES:
        stat = (root / name).stat()
        parts.append(f"{name}:{stat.st_size}:{stat.st_mtime_ns}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class VoxModel:
    precision: str  # "q8" | "bf16"
    path: Path
    converted_s: float  # 0.0 when it came from the cache


def convert(model_dir: Path, cache_dir: Path, precision: str) -> VoxModel:
    """`model_dir` converted by vox at `precision`, into `cache_dir` once (reused after)."""
    import time  # noqa: PLC0415

    folder = cache_dir / cache_key(model_dir, vox_version())
    path = folder / f"cosyvoice2.{precision}.tmod"
    if path.exists():
        return VoxModel(precision, path, 0.0)
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial.tmod")
    command = [
        sys.executable,
        "-m",
        "vox.build_cosyvoice",
        "--model",
        str(model_dir),
        "-o",
        str(partial),
        *VOX_PRECISIONS[precision],
        "--no-clone",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-5:])
        raise VoxConversionError(f"{' '.join(command)} exited {done.returncode}:\n{tail}")
    partial.replace(path)
    return VoxModel(precision, path, time.perf_counter() - start)


def write_vox_voice(vox_model: Path, prompt: VoicePrompt, text_ids: list[int], out: Path) -> Path:
    """A .tvoice holding `prompt` as vox's CosyVoice features (its zero-shot voice: the LLM is
    prompted with the transcript and the speech tokens, the flow with the mel and embedding)."""
    from vox.formats import VoiceProfile, read_tmod_manifest  # noqa: PLC0415

    manifest = read_tmod_manifest(str(vox_model))
    tokens = np.ascontiguousarray(prompt.speech_tokens, dtype=np.int32)
    profile = VoiceProfile(
        speaker_emb=np.ascontiguousarray(prompt.embedding, dtype=np.float32),
        name="cosyq-prompt",
        mode="icl",
        ref_text=prompt.transcript,
        ref_codes=tokens.reshape(-1, 1),
        ref_text_tokens=np.asarray(text_ids, dtype=np.int32),
        model=manifest["model"],
        kv_cache={  # vox stores a CosyVoice voice's features under these names
            "feat.cosy_tokens": tokens,
            "feat.cosy_mel": np.ascontiguousarray(prompt.mel, dtype=np.float32),
            "feat.cosy_xvec": np.ascontiguousarray(prompt.embedding, dtype=np.float32),
        },
    )
    profile.save(str(out))
    return out
