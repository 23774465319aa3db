"""CosyVoice 3's vocoder on Core ML: the stand-in for `CausalHiFTGenerator.inference`.

Two packages, as CosyVoice 2's (`runtime.CoreMLHiFT`): `hift_source` (float32: the causal F0
predictor and the sine source) then `hift_decode`. The source's noise is upstream's fixed
uniform buffer, not a random draw: the runtime takes its first 480·T samples from the same
`SourceBuffer` the torch model uses and passes them in, so the output is deterministic and equal
inputs give equal outputs on a Mac and in PyTorch. Non-streaming only (finalize=True): a
streamed CosyVoice 3 piece re-runs HiFT with finalize=False, which is not converted.
"""

from __future__ import annotations

import torch
from torch import Tensor

from shared.errors import InvalidRequestError
from workers.coreml.batch_sizes import BatchSizes
from workers.coreml.runtime import Predictor, _f32, _predict, _tensor
from workers.coreml.stages import HIFT_DECODE, HIFT_SOURCE, UNBATCHED
from workers.model.causal_hift.config import CausalHiFTConfig
from workers.model.causal_hift.source import SourceBuffer
from workers.model.hift.model import HiFTOutput


class CoreMLCausalHiFT:
    """The causal vocoder on two packages; `inference` as `CausalHiFTGenerator.inference`."""

    def __init__(
        self,
        config: CausalHiFTConfig,
        source: Predictor,
        decode: Predictor,
        *,
        batch_sizes: tuple[int, ...] = UNBATCHED,
    ) -> None:
        self.config = config
        self.source = source
        self.decode_model = decode
        self.buffer = SourceBuffer(config)  # upstream's fixed noise, drawn as far as needed
        self.batch_sizes = BatchSizes(batch_sizes)  # rows per call of both packages

    def excitation(self, mel: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """mel (B, 80, T), noise (B, 9, 480·T) in [0, 1) -> source (B, 1, 480·T), f0 (B, T)."""
        data = {"mel": _f32(mel), "noise": _f32(noise)}
        out = _predict(self.source, data, self.batch_sizes, HIFT_SOURCE)
        return _tensor(out["source"]), _tensor(out["f0"])

    def decode(self, mel: Tensor, source: Tensor) -> Tensor:
        """mel (B, 80, T), source (B, 1, 480·T) -> wav (B, 480·T)."""
        data = {"mel": _f32(mel), "source": _f32(source)}
        return _tensor(_predict(self.decode_model, data, self.batch_sizes, HIFT_DECODE)["wav"])

    def buffer_noise(self, frames: int, rows: int = 1) -> Tensor:
        """(rows, 9, 480·frames): the fixed buffer's first samples, as the torch model uses."""
        samples = frames * self.config.base.samples_per_frame
        return self.buffer.prefix(samples).transpose(1, 2).expand(rows, -1, -1)

    def inference(
        self,
        mel: Tensor,
        *,
        finalize: bool = True,
        generator: torch.Generator | None = None,
    ) -> HiFTOutput:
        """mel (1, 80, T) -> HiFTOutput(wav (1, 480·T), source, f0); deterministic, so
        `generator` is not drawn from (it is there for the warm-up's CosyVoice 2 call shape)."""
        if not finalize:
            raise ValueError("the Core ML causal HiFT converts the finalize=True path only")
        if mel.dim() != 3 or mel.size(0) != 1:
            raise InvalidRequestError(f"hift mel: expected (1, 80, T), got {tuple(mel.shape)}")
        mel = mel.to("cpu", torch.float32)
        source, f0 = self.excitation(mel, self.buffer_noise(mel.size(-1)))
        return HiFTOutput(self.decode(mel, source), source, f0)
