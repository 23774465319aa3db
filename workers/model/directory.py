"""A CosyVoice 2 or 3 model directory in the upstream layout, checked before anything is loaded.

`COSYQ_MODEL_DIR` points at a real `CosyVoice2-0.5B` or `Fun-CosyVoice3-0.5B` download or at a
tiny directory written by `cosyq-worker model init-tiny [--family cosyvoice3]`. The family comes
from the directory itself, never from a setting: `cosyvoice2.yaml` (+ `speech_tokenizer_v2.onnx`)
or `cosyvoice3.yaml` (+ `speech_tokenizer_v3.onnx`); a directory with neither or both is a
`ModelLoadError` naming what was found. Every missing or unreadable file is reported by name
with what was expected there, so a worker fails at start-up with one clear message instead of
deep in a stack trace, and never downloads anything.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from shared.errors import ModelLoadError

YAML_FILE = "cosyvoice2.yaml"
QWEN_DIR = "CosyVoice-BlankEN"
CHECKPOINTS = ("llm", "flow", "hift")
FAMILY_YAML = {"cosyvoice2": YAML_FILE, "cosyvoice3": "cosyvoice3.yaml"}
FAMILY_NAMES = {"cosyvoice2": "CosyVoice 2", "cosyvoice3": "CosyVoice 3"}  # as users read them
FAMILY_SPEECH_TOKENIZER = {
    "cosyvoice2": "speech_tokenizer_v2.onnx",
    "cosyvoice3": "speech_tokenizer_v3.onnx",
}
EXPECTED_FILES: dict[str, str] = {
    YAML_FILE: "the model configuration (HyperPyYAML)",
    "llm.pt": "the Qwen2LM state_dict (torch.save)",
    "flow.pt": "the flow-matching state_dict (torch.save)",
    "hift.pt": "the HiFT vocoder state_dict (torch.save)",
    "campplus.onnx": "the CAM++ speaker-embedding ONNX model",
    "speech_tokenizer_v2.onnx": "the 25 Hz speech-tokenizer ONNX model",
    f"{QWEN_DIR}/config.json": "the Qwen2 backbone configuration",
    f"{QWEN_DIR}/vocab.json": "the Qwen2 BPE vocabulary",
    f"{QWEN_DIR}/merges.txt": "the Qwen2 BPE merges",
    f"{QWEN_DIR}/tokenizer_config.json": "the Qwen2 tokenizer configuration (added tokens)",
}
PROMPT_AUDIO = "prompt.wav"  # optional: the directory's built-in default voice
PROMPT_TEXT = "prompt.txt"
_HASH_CHUNK = 8 << 20


def expected_files(family: str) -> dict[str, str]:
    """Every file a directory of `family` must have, with what it is."""
    if family == "cosyvoice2":
        return EXPECTED_FILES
    renamed = {YAML_FILE: FAMILY_YAML[family]}
    renamed[FAMILY_SPEECH_TOKENIZER["cosyvoice2"]] = FAMILY_SPEECH_TOKENIZER[family]
    files = {renamed.get(name, name): what for name, what in EXPECTED_FILES.items()}
    files["llm.pt"] = "the CosyVoice3LM state_dict (torch.save)"
    return files


@dataclass(frozen=True)
class ModelDirectory:
    """Paths and plain-data configuration of one model directory."""

    root: Path

    @cached_property
    def family(self) -> str:
        """ "cosyvoice2" or "cosyvoice3", from which model yaml the directory holds."""
        if not self.root.is_dir():
            raise ModelLoadError(f"{self.root}: model directory not found")
        found = [family for family, name in FAMILY_YAML.items() if (self.root / name).is_file()]
        if len(found) == 1:
            return found[0]
        if found:
            both = " and ".join(FAMILY_YAML.values())
            raise ModelLoadError(
                f"{self.root}: both {both} found; a model directory holds one model family"
            )
        yamls = " or ".join(FAMILY_YAML.values())
        names = sorted(p.name for p in self.root.iterdir())
        shown = ", ".join(names[:12]) + (f", ... ({len(names)} entries)" if len(names) > 12 else "")
        raise ModelLoadError(
            f"{self.root}: neither a CosyVoice 2 nor a CosyVoice 3 model directory: no {yamls} "
            f"(found: {shown or 'nothing'})"
        )

    def check_layout(self) -> None:
        """Raise ModelLoadError naming every missing file and what it should have been."""
        missing = [
            f"{name} ({what})"
            for name, what in expected_files(self.family).items()
            if not (self.root / name).is_file()
        ]
        if missing:
            raise ModelLoadError(f"{self.root}: missing " + "; ".join(missing))

    def path(self, name: str) -> Path:
        return self.root / name

    def checkpoint(self, stage: str) -> Path:
        return self.root / f"{stage}.pt"

    @cached_property
    def yaml(self) -> dict[str, Any]:
        # PyYAML only when a config is read: the job side imports this module for file names
        from workers.model.yaml_plain import load_plain_yaml  # noqa: PLC0415

        return load_plain_yaml(self.root / FAMILY_YAML[self.family])

    @cached_property
    def qwen_config(self) -> dict[str, Any]:
        path = self.root / QWEN_DIR / "config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: unreadable Qwen2 config ({e})") from e
        if not isinstance(data, dict):
            raise ModelLoadError(f"{path}: expected a JSON object")
        return data

    @property
    def name(self) -> str:
        return self.root.resolve().name


def file_sha256(path: Path, cache_dir: Path | None = None) -> str:
    """SHA-256 of a file, cached by (path, size, mtime) so recycled workers don't rehash 2.5 GB."""
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    cache_file = None
    if cache_dir is not None:
        cache_file = cache_dir / (hashlib.sha256(key.encode()).hexdigest()[:32] + ".sha256")
        if cache_file.is_file():
            return cache_file.read_text().strip()
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
    value = digest.hexdigest()
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(value)
        tmp.replace(cache_file)
    return value


def checkpoint_hashes(directory: ModelDirectory, cache_dir: Path | None = None) -> dict[str, str]:
    """Per-file SHA-256 of llm.pt, flow.pt and hift.pt."""
    return {f"{s}.pt": file_sha256(directory.checkpoint(s), cache_dir) for s in CHECKPOINTS}


def combined_hash(hashes: dict[str, str]) -> str:
    """One short identity for a set of checkpoints (reported in every result)."""
    joined = "\n".join(f"{name}={value}" for name, value in sorted(hashes.items()))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]
