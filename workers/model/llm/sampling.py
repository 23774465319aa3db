"""Speech-token sampling of CosyVoice 2's LLM: repetition-aware sampling (RAS, from VALL-E 2).

Each step: nucleus sampling (top-p, capped at top-k candidates, one multinomial draw); if the
drawn id already occurs at least `win_size * tau_r` times among the last `win_size` outputs,
the draw is discarded and one new id is drawn from the full softmax (that distribution still
contains the repeated id; upstream calls this re-sampling a "ban" but does not exclude it).

Randomness comes only from the caller's `torch.Generator`, consumed in exactly upstream's
order and amounts (one multinomial over the candidates, then possibly one over the full
vocabulary), so a CPU generator seeded N reproduces upstream's tokens after
`torch.manual_seed(N)`. Sampling runs on CPU whatever the model's device, so a seed gives the
same choices on cpu, mps and cuda.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from shared.errors import ModelLoadError

# Upstream's Qwen2LM.inference defaults; cosyvoice2.yaml does not set them.
DEFAULT_MIN_TOKEN_TEXT_RATIO = 2.0
DEFAULT_MAX_TOKEN_TEXT_RATIO = 20.0


@dataclass(frozen=True)
class SamplingConfig:
    """RAS parameters and the generated-length bounds (multiples of the TTS text tokens)."""

    top_p: float = 0.8
    top_k: int = 25
    win_size: int = 10
    tau_r: float = 0.1
    min_token_text_ratio: float = DEFAULT_MIN_TOKEN_TEXT_RATIO
    max_token_text_ratio: float = DEFAULT_MAX_TOKEN_TEXT_RATIO

    def __post_init__(self) -> None:
        problems = []
        if not 0.0 < self.top_p <= 1.0:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 1:
            problems.append(f"top_k must be >= 1, got {self.top_k}")
        if self.win_size < 1:
            problems.append(f"win_size must be >= 1, got {self.win_size}")
        if not 0 <= self.min_token_text_ratio <= self.max_token_text_ratio:
            problems.append(
                f"need 0 <= min_token_text_ratio ({self.min_token_text_ratio}) <= "
                f"max_token_text_ratio ({self.max_token_text_ratio})"
            )
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_mapping(cls, doc: Mapping[str, Any], *, source: str) -> SamplingConfig:
        """From a mapping of upstream's sampling keys (the yaml's `sampling` entry)."""
        try:
            return cls(
                top_p=float(doc["top_p"]),
                top_k=int(doc["top_k"]),
                win_size=int(doc["win_size"]),
                tau_r=float(doc["tau_r"]),
                min_token_text_ratio=float(
                    doc.get("min_token_text_ratio", DEFAULT_MIN_TOKEN_TEXT_RATIO)
                ),
                max_token_text_ratio=float(
                    doc.get("max_token_text_ratio", DEFAULT_MAX_TOKEN_TEXT_RATIO)
                ),
            )
        except KeyError as e:
            raise ModelLoadError(f"{source}: sampling is missing key {e.args[0]!r}") from e
        except (TypeError, ValueError) as e:
            raise ModelLoadError(f"{source}: invalid sampling parameters ({e})") from e

    def length_bounds(self, text_tokens: int) -> tuple[int, int]:
        """(min, max) generated tokens for `text_tokens` TTS text tokens (prompt text excluded)."""
        return (
            int(text_tokens * self.min_token_text_ratio),
            int(text_tokens * self.max_token_text_ratio),
        )


def nucleus_size(sorted_probs: torch.Tensor, top_p: float, top_k: int) -> int:
    """How many of the descending `sorted_probs` the nucleus keeps.

    A candidate is kept while the float32 running sum of those before it is below top_p and
    fewer than top_k are kept, so the first one always is. The sum is accumulated sequentially
    in float32 as upstream's loop does (torch.cumsum accumulates in double on CPU).
    """
    head = sorted_probs[:top_k].detach().to("cpu", torch.float32).numpy()
    before = np.cumsum(head[:-1], dtype=np.float32)  # sum of candidates 0..i, i < top_k - 1
    below = before < np.float32(top_p)
    return 1 + int(np.argmin(below)) if not below.all() else len(head)


def top_candidates(probs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first `k` (values, ids) of `probs.sort(descending=True, stable=True)`, without
    sorting the whole vocabulary: `topk` finds the k-th value, ids above it and the lowest ids
    equal to it fill the k places (ties in id order, as the stable sort keeps them). A full
    sort of the 6,564 speech scores took ~0.37 ms a row and step (7.6% of a 16-row batched
    decode step on an AMX Xeon); this takes a fraction. Not finite scores take the full sort."""
    k = min(k, probs.numel())
    threshold = torch.topk(probs, k, sorted=False).values.min()
    if not torch.isfinite(threshold):
        values, ids = probs.sort(descending=True, stable=True)
        return values[:k], ids[:k]
    above = torch.nonzero(probs > threshold).flatten()
    tied = torch.nonzero(probs == threshold).flatten()[: k - above.numel()]
    ids = torch.cat([above, tied])  # ascending ids within each value: stable order kept below
    values, order = probs[ids].sort(descending=True, stable=True)
    return values, ids[order]


def ras_sampling(
    logp: torch.Tensor,
    decoded: Sequence[int],
    config: SamplingConfig,
    generator: torch.Generator,
) -> int:
    """Draw one id from the scores `logp` (V,), given the ids `decoded` so far."""
    probs = logp.detach().to("cpu", torch.float32).softmax(dim=0)
    sorted_probs, sorted_ids = top_candidates(probs, config.top_k)
    kept = nucleus_size(sorted_probs, config.top_p, config.top_k)
    pick = torch.multinomial(sorted_probs[:kept], 1, replacement=True, generator=generator)
    token = int(sorted_ids[pick])
    recent = list(decoded[-config.win_size :])
    if recent.count(token) >= config.win_size * config.tau_r:
        token = int(torch.multinomial(probs, 1, replacement=True, generator=generator))
    return token
