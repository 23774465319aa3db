"""Core ML stand-ins for the torch flow and HiFT objects the pipeline calls.

`CoreMLFlow.inference` has the call shape of `CausalMaskedDiffWithXvec.inference` and
`CoreMLHiFT.inference` that of `HiFTGenerator.inference`, so the engine swaps objects, not code.
Both drive "predictors": anything with `predict(dict[str, ndarray]) -> dict[str, ndarray]`,
which on a Mac is a `coremltools.models.CompiledMLModel` (see `loader`). Tensors cross the
package boundary as float32/int32 numpy arrays on the CPU.

Input validation, the prompt condition and the fixed CFM noise come from a flow module built on
the meta device (no weights), so requests are checked by the very code the torch path uses.
Only the non-streaming path (streaming=False, finalize=True) is converted.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from shared.errors import InvalidRequestError
from workers.coreml.convert.graphs import pack_cfm_frames
from workers.model.flow import CausalMaskedDiffWithXvec
from workers.model.flow_config import FlowConfig
from workers.model.hift import HiFTOutput
from workers.model.hift_config import HiFTConfig
from workers.model.hift_source import SourceNoise, draw_source_noise


class Predictor(Protocol):
    """The part of a Core ML model we call (CompiledMLModel and MLModel both have it)."""

    def predict(self, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def _f32(x: Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy())


def _tensor(array: np.ndarray) -> Tensor:
    """A float32 tensor owning a copy (predict's arrays may be read-only views)."""
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))


class CoreMLFlow:
    """The flow stage on two packages: `flow_encoder` then `flow_cfm`."""

    def __init__(
        self,
        config: FlowConfig,
        encoder: Predictor,
        cfm: Predictor,
        *,
        buckets: tuple[int, ...] = (),
    ) -> None:
        self.config = config
        self.encoder = encoder
        self.cfm = cfm
        self.buckets = buckets  # enumerated CFM frame counts; empty = flexible package
        with torch.device("meta"):
            self._shell = CausalMaskedDiffWithXvec(config)  # checks, prompt condition, noise

    def encode(self, tokens: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        """tokens (1, N), embedding (1, 192) -> mu (1, 80, 2N), speaker vector (1, 80)."""
        out = self.encoder.predict(
            {"tokens": tokens.to("cpu", torch.int32).numpy(), "embedding": _f32(embedding)}
        )
        return _tensor(out["mu"]), _tensor(out["spks"])

    def solve(self, noise: Tensor, mu: Tensor, mask: Tensor, spks: Tensor, cond: Tensor) -> Tensor:
        """`ConditionalFlowMatching.forward`: noise, mu, cond (1, 80, T), mask (1, 1, T), spks
        (1, 80) -> mel (1, 80, T). With buckets, T is padded (mask 0) to the next bucket."""
        frames = pack_cfm_frames(noise, mu, cond, mask)
        length = frames.size(-1)
        padded = self.bucket_for(length)
        frames = torch.nn.functional.pad(frames, (0, padded - length))
        out = self.cfm.predict({"frames": _f32(frames), "spks": _f32(spks)})
        return _tensor(out["mel"])[:, :, :length]

    def bucket_for(self, frames: int) -> int:
        """The smallest bucket holding `frames` (`frames` itself when the package is flexible)."""
        if not self.buckets:
            return frames
        index = bisect.bisect_left(self.buckets, frames)
        if index == len(self.buckets):
            raise InvalidRequestError(
                f"flow: {frames} mel frames (prompt + target) exceed the largest Core ML shape "
                f"bucket ({self.buckets[-1]}); convert with larger --flow-buckets"
            )
        return self.buckets[index]

    def inference(
        self,
        token: Tensor,
        prompt_token: Tensor,
        prompt_feat: Tensor,
        embedding: Tensor,
        *,
        streaming: bool = False,
        finalize: bool = True,
        stage_done: Callable[[str], None] | None = None,
    ) -> tuple[Tensor, None]:
        """Mel (1, 80, T_out) after the prompt frames, as the torch flow's `inference` returns.

        Only the non-streaming path is converted; `stage_done` gets "encoder" and "cfm".
        """
        if streaming or not finalize:
            raise ValueError("the Core ML flow converts the non-streaming path only")
        shell, mark = self._shell, stage_done or (lambda _stage: None)
        shell._check_inputs(token, prompt_token, prompt_feat, embedding)
        shell._check_length(token.size(1) + prompt_token.size(1), token.size(1), finalize)
        tokens = torch.cat([prompt_token.to(torch.int32), token.to(torch.int32)], dim=1)
        mu, spks = self.encode(tokens, embedding)
        mark("encoder")
        num_frames = mu.size(-1)
        cond = shell.prompt_condition(prompt_feat.to("cpu", torch.float32), num_frames)
        mask = torch.ones(1, 1, num_frames)
        mel = self.solve(shell.decoder.noise(num_frames), mu, mask, spks, cond)
        mark("cfm")
        return mel[:, :, prompt_feat.size(1) :], None


class CoreMLHiFT:
    """The vocoder on two packages: `hift_source` (float32) then `hift_decode`."""

    def __init__(self, config: HiFTConfig, source: Predictor, decode: Predictor) -> None:
        self.config = config
        self.source = source
        self.decode_model = decode
        self.harmonics = config.nb_harmonics + 1

    def excitation(self, mel: Tensor, normal: Tensor) -> tuple[Tensor, Tensor]:
        """mel (1, 80, T), normal (1, 9, 480·T) -> source (1, 1, 480·T), f0 (1, T)."""
        out = self.source.predict({"mel": _f32(mel), "noise": _f32(normal)})
        return _tensor(out["source"]), _tensor(out["f0"])

    def decode(self, mel: Tensor, source: Tensor) -> Tensor:
        """mel (1, 80, T), source (1, 1, 480·T) -> wav (1, 480·T)."""
        out = self.decode_model.predict({"mel": _f32(mel), "source": _f32(source)})
        return _tensor(out["wav"])

    def forward(self, mel: Tensor, noise: Tensor) -> Tensor:
        """`HiFTGenerator.forward`: mel (1, 80, T), noise (1, 9, 480·T) -> wav (1, 480·T)."""
        source, _ = self.excitation(mel, noise)
        return self.decode(mel, source)

    def inference(
        self,
        mel: Tensor,
        *,
        generator: torch.Generator | None = None,
        noise: SourceNoise | None = None,
        source_prefix: Tensor | None = None,
    ) -> HiFTOutput:
        """`HiFTGenerator.inference`: random draws from `noise`, else from `generator`."""
        if mel.dim() != 3 or mel.size(0) != 1:
            raise InvalidRequestError(f"hift mel: expected (1, 80, T), got {tuple(mel.shape)}")
        if noise is None:
            samples = mel.size(-1) * self.config.samples_per_frame
            noise = draw_source_noise(1, self.harmonics, samples, generator=generator)
        source, f0 = self.excitation(mel, noise.normal)
        if source_prefix is not None and source_prefix.shape[-1] > 0:
            source[:, :, : source_prefix.shape[-1]] = source_prefix.to("cpu", torch.float32)
        return HiFTOutput(self.decode(mel, source), source, f0)
