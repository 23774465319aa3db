"""How close another LLM (the int8 ONNX Runtime step) stays to our fp32 one, step by step.

Two measures of "the same sampled tokens at a fixed seed". Free-running (`free_running`): each
model samples its own history from a generator seeded alike; after the first different draw the
two histories (and the generators' positions) differ, so every later step compares different
contexts and agreement compounds. Teacher-forced (`compare_llm`, the one the 95% bar can mean):
on the reference: both models see the same prefix and, after it, the tokens the
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
from workers.model.llm.sampling import nucleus_size, ras_sampling, top_candidates


@dataclass(frozen=True)
class FreeRunning:
    """Free-running draws of both models from the same seed: position-wise agreement."""

    agreed: int
    steps: int
    first_divergence: int | None  # the first step whose tokens differ, None if none did

    def line(self) -> str:
        first = "none" if self.first_divergence is None else str(self.first_divergence)
        return (
            f"sampled tokens agreeing, same seed    {self.agreed:5d} / {self.steps} "
            f"({100 * self.agreed / max(self.steps, 1):.1f}%), free-running; first "
            f"divergence at step {first}"
        )


@dataclass(frozen=True)
class LLMAgreement:
    """Per-step SNRs (prefill first) and how many sampled tokens agreed over `steps`."""

    snr_db: tuple[float, ...]
    agreed: int
    steps: int
    raw_snr_db: tuple[float, ...] = ()  # not centred (the issue-22 note's measure)
    greedy_agreed: int = 0  # steps whose argmax ids are the same
    id_ordered_agreed: int = 0  # steps whose `id_ordered_draw`s (same u) are the same
    overlap: tuple[float, ...] = ()  # per step: 1 - TV of the two nucleus distributions
    free: FreeRunning | None = None  # the same seed, free-running (`free_running`)

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
            f"({100 * self.share:.1f}%), teacher-forced",
            f"greedy (argmax) tokens agreeing       {self.greedy_agreed:5d} / {self.steps}",
            f"same u, ids-ordered nucleus draw      {self.id_ordered_agreed:5d} / {self.steps}",
            f"nucleus overlap 1-TV, mean (the most a shared draw can agree) "
            f"{100 * statistics.fmean(self.overlap or (1.0,)):.1f}%",
            *([self.free.line()] if self.free else []),
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


def nucleus(logp: torch.Tensor, top_p: float, top_k: int) -> dict[int, float]:
    """The distribution `ras_sampling`'s first draw picks from: {id: probability}."""
    probs = logp.detach().float().softmax(dim=0)
    values, ids = top_candidates(probs, top_k)
    kept = nucleus_size(values, top_p, top_k)
    mass = values[:kept].double()
    mass = mass / mass.sum()
    return dict(zip(ids[:kept].tolist(), mass.tolist(), strict=True))


def overlap(p: dict[int, float], q: dict[int, float]) -> float:
    """sum_i min(p_i, q_i) = 1 - total variation: the highest chance any coupling of the two
    draws (one shared random number per step) gives the same id."""
    return sum(min(v, q.get(k, 0.0)) for k, v in p.items())


def id_ordered_draw(distribution: dict[int, float], u: float) -> int:
    """The id whose cumulative probability, ids ascending, first exceeds `u` in [0, 1): an
    inverse-CDF draw that does not depend on the candidates' order by score (the sampler's
    multinomial walks them sorted by score, so two close scores swapping moves every draw
    that lands on either)."""
    total = 0.0
    for token in sorted(distribution):
        total += distribution[token]
        if u < total:
            return token
    return max(distribution)


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
    snrs, raws, agreed, greedy = [centred_snr_db(*logps)], [raw_snr_db(*logps)], 0, 0
    uniform, id_ordered = torch.Generator().manual_seed(seed + 1), 0
    sampling = reference.config.sampling
    overlaps: list[float] = []
    decoded: list[int] = []
    for step in range(steps):
        for logp in logps:
            logp[stops] = float("-inf")
        state = generator.get_state()
        token, theirs = (_draw(logp, decoded, reference, state) for logp in logps)
        agreed += token == theirs
        greedy += int(logps[0].argmax()) == int(logps[1].argmax())
        ours, theirs_nucleus = (nucleus(lp, sampling.top_p, sampling.top_k) for lp in logps)
        overlaps.append(overlap(ours, theirs_nucleus))
        u = float(torch.rand((), generator=uniform))
        id_ordered += id_ordered_draw(ours, u) == id_ordered_draw(theirs_nucleus, u)
        generator.set_state(state)
        ras_sampling(logps[0], decoded, reference.config.sampling, generator)  # advance it
        decoded.append(token)
        if step + 1 == steps:
            break
        embed = reference.speech_embedding.weight[token].view(1, 1, -1)
        logps = [_step_logp(m, c, embed) for m, c in zip(models, caches, strict=True)]
        snrs.append(centred_snr_db(*logps))
        raws.append(raw_snr_db(*logps))
    return LLMAgreement(
        snr_db=tuple(snrs),
        agreed=agreed,
        steps=steps,
        raw_snr_db=tuple(raws),
        greedy_agreed=greedy,
        id_ordered_agreed=id_ordered,
        overlap=tuple(overlaps),
    )


def free_tokens(model: SpeechLM, prefix: torch.Tensor, steps: int, seed: int) -> list[int]:
    """`steps` ids `model` samples after `prefix` on its own history, stop ids masked."""
    stops = list(model.config.stop_tokens)
    dtype = model.speech_embedding.weight.dtype
    cache = KVCache(model.config.backbone, prefix.shape[1] + steps, dtype=dtype)
    generator = torch.Generator().manual_seed(seed)
    logp = _step_logp(model, cache, prefix)
    decoded: list[int] = []
    for step in range(steps):
        logp[stops] = float("-inf")
        decoded.append(ras_sampling(logp, decoded, model.config.sampling, generator))
        if step + 1 < steps:
            embed = model.speech_embedding.weight[decoded[-1]].view(1, 1, -1).float()
            logp = _step_logp(model, cache, embed)
    return decoded


def agreement_of(ours: list[int], theirs: list[int]) -> FreeRunning:
    same = [a == b for a, b in zip(ours, theirs, strict=True)]
    first = next((i for i, s in enumerate(same) if not s), None)
    return FreeRunning(agreed=sum(same), steps=len(same), first_divergence=first)


@torch.inference_mode()
def free_running(
    reference: SpeechLM, other: SpeechLM, prefix: torch.Tensor, *, steps: int, seed: int = 0
) -> FreeRunning:
    """Both models sample `steps` ids on their own histories from the same seed."""
    ours = free_tokens(reference, prefix, steps, seed)
    theirs = free_tokens(other, prefix, steps, seed)
    return agreement_of(ours, theirs)
