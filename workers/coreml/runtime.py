"""Core ML stand-ins for the torch flow and HiFT objects the pipeline calls.

`CoreMLFlow.inference` has the call shape of `CausalMaskedDiffWithXvec.inference` and
`CoreMLHiFT.inference` that of `HiFTGenerator.inference`, so the engine swaps objects, not code.
Both drive "predictors": anything with `predict(dict[str, ndarray]) -> dict[str, ndarray]`,
which on a Mac is a `coremltools.models.CompiledMLModel` (see `loader`). Tensors cross the
package boundary as float32/int32 numpy arrays on the CPU.

Input validation and the fixed CFM noise come from a flow module built on the meta device (no
weights; CosyVoice 2's or, for a `DiTFlowConfig`, CosyVoice 3's), so requests are checked by
the very code the torch path uses. Only the non-streaming path (streaming=False, finalize=True)
is converted. CosyVoice 3's vocoder is `causal_runtime.CoreMLCausalHiFT`.

Batched packages (`--batch-sizes`) also take several rows per call: `batched_inference` of each
stage (what the engine's batch session calls) splits the rows into calls of the package's sizes
(`BatchSizes.groups`), fills a call up to its size with copies of its first row and drops them
from the output. The flow pads rows to the longest as `workers.model.flow.batch` does (the
encoder is told each row's length, the CFM masks padded frames). HiFT's convolutions are not
causal and its STFT reflects at the end, so a padded row would change well before its end:
only rows of equal length share a vocoder call. Unbatched packages keep the batch-1 calls.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from shared.errors import InvalidRequestError
from workers.coreml.batch_sizes import BatchSizes
from workers.coreml.convert.graphs import pack_cfm_frames
from workers.coreml.stages import UNBATCHED
from workers.model.dit.config import DiTFlowConfig
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.flow.batch import FlowRow
from workers.model.flow.config import FlowConfig
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.hift.config import HiFTConfig
from workers.model.hift.model import HiFTOutput
from workers.model.hift.source import SourceNoise, draw_source_noise


class Predictor(Protocol):
    """The part of a Core ML model we call (CompiledMLModel and MLModel both have it)."""

    def predict(self, data: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...


def _f32(x: Tensor) -> np.ndarray:
    return np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy())


def _tensor(array: np.ndarray) -> Tensor:
    """A float32 tensor owning a copy (predict's arrays may be read-only views)."""
    return torch.from_numpy(np.array(array, dtype=np.float32, copy=True))


def _predict(
    model: Predictor, data: dict[str, np.ndarray], sizes: BatchSizes, package: str
) -> dict[str, np.ndarray]:
    """One package call; its rows must be one of the package's batch sizes."""
    sizes.require(len(next(iter(data.values()))), package)
    return model.predict(data)


def _filled(rows: Sequence[int], size: int) -> list[int]:
    """Row indices of one call: `rows`, then copies of the first up to `size` (dropped after)."""
    return [*rows, *[rows[0]] * (size - len(rows))]


class CoreMLFlow:
    """The flow stage on two packages: `flow_encoder` then `flow_cfm`."""

    def __init__(
        self,
        config: FlowConfig | DiTFlowConfig,
        encoder: Predictor,
        cfm: Predictor,
        *,
        buckets: tuple[int, ...] = (),
        batch_sizes: tuple[int, ...] = UNBATCHED,
    ) -> None:
        self.config = config
        self.encoder = encoder
        self.cfm = cfm
        self.buckets = buckets  # enumerated CFM frame counts; empty = flexible package
        self.batch_sizes = BatchSizes(batch_sizes)  # rows per call of both packages
        self._shell: CausalMaskedDiffWithXvec | CausalMaskedDiffWithDiT
        with torch.device("meta"):  # the request checks and the noise of the family's flow
            if isinstance(config, DiTFlowConfig):
                self._shell = CausalMaskedDiffWithDiT(config)
            else:
                self._shell = CausalMaskedDiffWithXvec(config)

    def _check(
        self, token: Tensor, prompt_token: Tensor, prompt_feat: Tensor, embedding: Tensor
    ) -> None:
        """The torch flow's own request checks (shapes, token ids, length), finalize=True."""
        shell = self._shell
        if isinstance(shell, CausalMaskedDiffWithDiT):
            shell._check_inputs(token, prompt_token, prompt_feat, embedding, True)
            return
        shell._check_inputs(token, prompt_token, prompt_feat, embedding)
        shell._check_length(token.size(1) + prompt_token.size(1), token.size(1), True)

    @property
    def batched(self) -> bool:
        """Whether the packages take several rows per call (`batched_inference`)."""
        return self.batch_sizes.batched

    def encode(
        self, tokens: Tensor, embedding: Tensor, lengths: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """tokens (B, N), embedding (B, 192), lengths (B,) real tokens per row (None: all) ->
        mu (B, 80, 2N), speaker vector (B, 80). An unbatched package takes B = 1, no lengths."""
        data = {"tokens": tokens.to("cpu", torch.int32).numpy(), "embedding": _f32(embedding)}
        if self.batched:
            if lengths is None:
                lengths = torch.full((tokens.size(0),), tokens.size(1))
            data["lengths"] = lengths.to("cpu", torch.int32).numpy()
        out = _predict(self.encoder, data, self.batch_sizes, "flow_encoder")
        return _tensor(out["mu"]), _tensor(out["spks"])

    def solve(self, noise: Tensor, mu: Tensor, mask: Tensor, spks: Tensor, cond: Tensor) -> Tensor:
        """`ConditionalFlowMatching.forward`: noise, mu, cond (B, 80, T), mask (B, 1, T), spks
        (B, 80) -> mel (B, 80, T). With buckets, T is padded (mask 0) to the next bucket."""
        frames = pack_cfm_frames(noise, mu, cond, mask)
        length = frames.size(-1)
        padded = self.bucket_for(length)
        frames = torch.nn.functional.pad(frames, (0, padded - length))
        data = {"frames": _f32(frames), "spks": _f32(spks)}
        out = _predict(self.cfm, data, self.batch_sizes, "flow_cfm")
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
        self._check(token, prompt_token, prompt_feat, embedding)
        tokens = torch.cat([prompt_token.to(torch.int32), token.to(torch.int32)], dim=1)
        mu, spks = self.encode(tokens, embedding)
        mark("encoder")
        num_frames = mu.size(-1)
        cond = torch.zeros(1, num_frames, self.config.mel_bins)
        cond[:, : prompt_feat.size(1)] = prompt_feat.to("cpu", torch.float32)
        cond = cond.transpose(1, 2)  # (1, 80, T): the prompt mel, zeros after
        mask = torch.ones(1, 1, num_frames)
        mel = self.solve(shell.decoder.noise(num_frames), mu, mask, spks, cond)
        mark("cfm")
        return mel[:, :, prompt_feat.size(1) :], None

    def batched_inference(self, rows: Sequence[FlowRow]) -> list[Tensor]:
        """Mel (80, 2N_i) per row, prompt frames excluded, as `flow_batch.batched_inference`
        gives for the torch flow: every row checked as alone, then calls of the batch sizes."""
        for row in rows:
            self._check(row.token, row.prompt_token, row.prompt_feat, row.embedding)
        mels: list[Tensor] = []
        for group in self.batch_sizes.groups(len(rows)):
            chosen = range(group.start, group.start + group.rows)
            mels += self._call(rows, _filled(chosen, group.size))[: group.rows]
        return mels

    def _call(self, rows: Sequence[FlowRow], indices: list[int]) -> list[Tensor]:
        """One encoder and one CFM call for rows[i] for i in `indices`, padded to the longest."""
        ratio, bins = self.config.token_mel_ratio, self.config.mel_bins
        ids = [
            torch.cat([rows[i].prompt_token, rows[i].token], dim=1)[0].to(torch.int32)
            for i in indices
        ]
        lengths = torch.tensor([t.numel() for t in ids], dtype=torch.int32)
        tokens = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
        embedding = torch.cat([rows[i].embedding for i in indices])
        mu, spks = self.encode(tokens, embedding, lengths)  # (B, 80, 2·N_max)
        frames, shell = mu.size(-1), self._shell
        mask = torch.zeros(len(indices), 1, frames)
        cond, noise = torch.zeros(len(indices), bins, frames), torch.zeros_like(mu)
        for b, i in enumerate(indices):
            n, prompt = ratio * int(lengths[b]), rows[i].prompt_feat[0].to("cpu", torch.float32)
            mask[b, :, :n] = 1
            cond[b, :, : prompt.size(0)] = prompt.transpose(0, 1)
            noise[b, :, :n] = shell.decoder.noise(n)[0]
        mel = self.solve(noise, mu, mask, spks, cond)
        return [
            mel[b, :, ratio * rows[i].prompt_token.size(1) : ratio * int(lengths[b])]
            for b, i in enumerate(indices)
        ]


class CoreMLHiFT:
    """The vocoder on two packages: `hift_source` (float32) then `hift_decode`."""

    def __init__(
        self,
        config: HiFTConfig,
        source: Predictor,
        decode: Predictor,
        *,
        batch_sizes: tuple[int, ...] = UNBATCHED,
    ) -> None:
        self.config = config
        self.source = source
        self.decode_model = decode
        self.harmonics = config.nb_harmonics + 1
        self.batch_sizes = BatchSizes(batch_sizes)  # rows per call of both packages

    @property
    def batched(self) -> bool:
        """Whether the packages take several rows per call (`batched_inference`)."""
        return self.batch_sizes.batched

    def excitation(self, mel: Tensor, normal: Tensor) -> tuple[Tensor, Tensor]:
        """mel (B, 80, T), normal (B, 9, 480·T) -> source (B, 1, 480·T), f0 (B, T)."""
        data = {"mel": _f32(mel), "noise": _f32(normal)}
        out = _predict(self.source, data, self.batch_sizes, "hift_source")
        return _tensor(out["source"]), _tensor(out["f0"])

    def decode(self, mel: Tensor, source: Tensor) -> Tensor:
        """mel (B, 80, T), source (B, 1, 480·T) -> wav (B, 480·T)."""
        data = {"mel": _f32(mel), "source": _f32(source)}
        out = _predict(self.decode_model, data, self.batch_sizes, "hift_decode")
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

    def batched_inference(
        self, mels: Sequence[Tensor], noises: Sequence[SourceNoise]
    ) -> list[Tensor]:
        """wav (1, 480·T_i) per mel (1, 80, T_i) with its own draws (normal (1, 9, 480·T_i)),
        as `inference(mel, noise=...)` gives alone: rows of equal T share calls."""
        for mel in mels:
            if mel.dim() != 3 or mel.size(0) != 1:
                raise InvalidRequestError(f"hift mel: expected (1, 80, T), got {tuple(mel.shape)}")
        wavs: list[Tensor | None] = [None] * len(mels)
        by_length: dict[int, list[int]] = {}
        for i, mel in enumerate(mels):
            by_length.setdefault(mel.size(-1), []).append(i)
        for same in by_length.values():
            for group in self.batch_sizes.groups(len(same)):
                chosen = same[group.start : group.start + group.rows]
                indices = _filled(chosen, group.size)
                mel = torch.cat([mels[i].to("cpu", torch.float32) for i in indices])
                normal = torch.cat([noises[i].normal.to("cpu", torch.float32) for i in indices])
                wav = self.decode(mel, self.excitation(mel, normal)[0])
                for b, i in enumerate(chosen):
                    wavs[i] = wav[b : b + 1]
        return [wav for wav in wavs if wav is not None]
