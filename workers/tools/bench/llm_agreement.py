"""How close another LLM (the int8 ONNX Runtime step) stays to our fp32 one, step by step.

Teacher-forced on the reference: both models see the same prefix and, after it, the tokens the
reference sampled, so one different draw does not make every later step incomparable. At each
step both log-prob vectors are compared (SNR of the centred vectors, as `precision.py` does)
and both are sampled with the same generator state (the fixed seed's draw for that step): the
tokens agree when the two draws pick the same id. Stop ids are masked in both, as a forced
length does (random weights put most of the mass on them, which would make agreement trivial).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch

from workers.model.llm.model import SpeechLM
from workers.model.llm.qwen2 import KVCache
from workers.model.llm.sampling import ras_sampling


@dataclass(frozen=True)
class LLMAgreement:
    """Per-step SNRs (prefill first) and how many sampled tokens agreed over `steps`."""

    snr_db: tuple[float, ...]
    agreed: int
    steps: int
    raw_snr_db: tuple[float, ...] = ()  # not centred (the issue-22 note's measure)

    @property
    def share(self) -> float:
        return self.agreed / self.steps if self.steps else 1.0

    def lines(self) -> list[str]:
        first, rest = self.snr_db[0], self.snr_db[1:21] or (math.inf,)
        raw = self.raw_snr_db[:21] or (math.inf,)
        return [
            f"LLM log-probs (raw), prefill + 20 steps, min {min(raw):.1f} dB, prefill {raw[0]:.1f}",
            f"LLM log-probs (centred), prefill      {first:8.1f} dB",
            f"LLM log-probs, 20 decode steps (min)  {min(rest):8.1f} dB "
            f"(median {statistics.median(rest):.1f})",
            f"sampled tokens agreeing, same seed    {self.agreed:5d} / {self.steps} "
            f"({100 * self.share:.1f}%)",
        ]


def centred_snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    ref, got = reference.double(), other.double()
    finite = torch.isfinite(ref) & torch.isfinite(got)
    ref = ref[finite] - ref[finite].mean()
    got = got[finite] - got[finite].mean()
    error = float(((ref - got) ** 2).sum())
    return math.inf if error == 0 else 10 * math.log10(float((ref**2).sum()) / error)


def raw_snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    ref, got = reference.double(), other.double()
    finite = torch.isfinite(ref) & torch.isfinite(got)
    error = float(((ref[finite] - got[finite]) ** 2).sum())
    return math.inf if error == 0 else 10 * math.log10(float((ref[finite] ** 2).sum()) / error)


def _step_logp(model: SpeechLM, cache: KVCache, embeds: torch.Tensor) -> torch.Tensor:
    """One step of `model`, the embeddings in its own dtype (a bf16 model against fp32)."""
    dtype = model.speech_embedding.weight.dtype
    return model.step_logp(embeds.to(dtype), cache).float()


def _draw(logp: torch.Tensor, decoded: list[int], model: SpeechLM, state: torch.Tensor) -> int:
    generator = torch.Generator()
    generator.set_state(state)
    return ras_sampling(logp, decoded, model.config.sampling, generator)


@torch.inference_mode()
def compare_llm(
    reference: SpeechLM,
    other: SpeechLM,
    prefix: torch.Tensor,
    *,
    steps: int,
    seed: int = 0,
) -> LLMAgreement:
    """`prefix` (1, P, hidden) embeddings (the reference's), then `steps` teacher-forced steps."""
    backbone = reference.config.backbone
    stops = list(reference.config.stop_tokens)
    models = (reference, other)
    caches = [
        KVCache(backbone, prefix.shape[1] + steps, dtype=m.speech_embedding.weight.dtype)
        for m in models
    ]
    logps = [_step_logp(m, c, prefix) for m, c in zip(models, caches, strict=True)]
    generator = torch.Generator().manual_seed(seed)
    snrs, raws, agreed = [centred_snr_db(*logps)], [raw_snr_db(*logps)], 0
    decoded: list[int] = []
    for step in range(steps):
        for logp in logps:
            logp[stops] = float("-inf")
        state = generator.get_state()
        token, theirs = (_draw(logp, decoded, reference, state) for logp in logps)
        agreed += token == theirs
        generator.set_state(state)
        ras_sampling(logps[0], decoded, reference.config.sampling, generator)  # advance it
        decoded.append(token)
        if step + 1 == steps:
            break
        embed = reference.speech_embedding.weight[token].view(1, 1, -1)
        logps = [_step_logp(m, c, embed) for m, c in zip(models, caches, strict=True)]
        snrs.append(centred_snr_db(*logps))
        raws.append(raw_snr_db(*logps))
    return LLMAgreement(snr_db=tuple(snrs), agreed=agreed, steps=steps, raw_snr_db=tuple(raws))
