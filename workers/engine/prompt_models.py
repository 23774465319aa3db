"""The two ONNX prompt models of a CosyVoice 2 directory, run with onnxruntime.

- `speech_tokenizer_v2.onnx`: whisper-style 128-bin log-mel (1, 128, T) float32 and its length
  (1,) int32, by position -> 25 Hz speech token ids (output 0, flattened to int32).
- `campplus.onnx`: mean-subtracted Kaldi fbank (1, T, 80) float32 -> (1, 192) speaker embedding
  (output 0, flattened, not normalised: the flow normalises it).
On macOS the Core ML execution provider runs them when this onnxruntime build has it; the CPU
provider always backs it up (and is all there is elsewhere). Sessions are created on first use:
a worker whose jobs name stored voices never pays for the ~0.5 GB speech tokenizer, and
onnxruntime itself is imported then too (a worker's start never waits for it).
"""

from __future__ import annotations

import platform
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from shared.errors import ModelLoadError

if TYPE_CHECKING:
    import onnxruntime as ort

SPEECH_TOKENIZER_FILE = "speech_tokenizer_v2.onnx"
SPEAKER_MODEL_FILE = "campplus.onnx"
COREML_PROVIDER = "CoreMLExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"


def onnx_providers(system: str | None = None, available: Sequence[str] | None = None) -> list[str]:
    """Core ML then CPU on macOS when the build has Core ML; CPU alone otherwise."""
    system = system or platform.system()
    if available is None:
        import onnxruntime  # noqa: PLC0415 (on first use: a worker's start never waits for it)

        available = onnxruntime.get_available_providers()
    if system == "Darwin" and COREML_PROVIDER in available:
        return [COREML_PROVIDER, CPU_PROVIDER]
    return [CPU_PROVIDER]


class OnnxModel:
    """One lazily created inference session; inputs by position, output 0 returned."""

    def __init__(self, path: Path, *, threads: int = 1) -> None:
        if not path.is_file():
            raise ModelLoadError(f"{path}: file missing (ONNX prompt model)")
        self.path = path
        self.threads = threads
        self._session: ort.InferenceSession | None = None
        self._lock = threading.Lock()

    @property
    def session(self) -> ort.InferenceSession:
        with self._lock:
            if self._session is None:
                self._session = self._open()
            return self._session

    def _open(self) -> ort.InferenceSession:
        import onnxruntime as ort  # noqa: PLC0415 (on first use: see the module's docstring)

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: the Core ML provider is chatty
        try:
            return ort.InferenceSession(
                str(self.path), sess_options=options, providers=onnx_providers()
            )
        except Exception as e:  # onnxruntime raises its own exception types for bad files
            raise ModelLoadError(f"{self.path}: onnxruntime cannot load it ({e})") from e

    def run(self, *inputs: np.ndarray) -> np.ndarray:
        session = self.session
        names = [spec.name for spec in session.get_inputs()]
        if len(names) != len(inputs):
            raise ModelLoadError(
                f"{self.path}: takes {len(names)} inputs, the front end passes {len(inputs)}"
            )
        return np.asarray(session.run(None, dict(zip(names, inputs, strict=True)))[0])


class PromptModels:
    """Speech tokens and speaker embedding of a prompt, from the model directory's ONNX files."""

    def __init__(
        self, root: Path, *, threads: int = 1, speech_tokenizer: str = SPEECH_TOKENIZER_FILE
    ) -> None:
        """`speech_tokenizer`: the family's file (CosyVoice 3: speech_tokenizer_v3.onnx)."""
        self.speech_tokenizer = OnnxModel(root / speech_tokenizer, threads=threads)
        self.speaker_model = OnnxModel(root / SPEAKER_MODEL_FILE, threads=threads)

    def speech_tokens(self, feats: np.ndarray, feats_length: np.ndarray) -> np.ndarray:
        """(1, 128, T) float32, (1,) int32 -> (n,) int32 speech token ids."""
        ids = self.speech_tokenizer.run(
            np.ascontiguousarray(feats, dtype=np.float32),
            np.ascontiguousarray(feats_length, dtype=np.int32),
        )
        return ids.reshape(-1).astype(np.int32)

    def speaker_embedding(self, fbank: np.ndarray) -> np.ndarray:
        """(1, T, 80) float32 -> (D,) float32 (D = 192 for CAM++)."""
        embedding = self.speaker_model.run(np.ascontiguousarray(fbank, dtype=np.float32))
        return embedding.reshape(-1).astype(np.float32)
