"""Speed of the flow stage at FULL size with random weights.

The flow comes from `workers.tools.fixtures.random_weights.random_flow` (no real checkpoint
needed). `time_flow(flow)` runs the three stages the way `inference` chains them
(speaker projection, encoder, CFM solve) and returns their times; `main()` prints a table.
Timings on a shared machine are noisy: compare runs made back to back.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from workers.model.flow.model import CausalMaskedDiffWithXvec

DEFAULT_TOKENS = 100  # 100 generated tokens (4 s of audio) ...
DEFAULT_PROMPT_TOKENS = 50  # ... after 50 prompt tokens: 300 mel frames through the CFM
DEFAULT_THREADS = 2
DEFAULT_RUNS = 3


@dataclass(frozen=True)
class FlowTiming:
    """Seconds per stage for each timed run (after warm-up); `mean` and `best` summarise them."""

    tokens: int
    prompt_tokens: int
    mel_frames: int
    threads: int
    speaker_s: tuple[float, ...]
    encoder_s: tuple[float, ...]
    cfm_s: tuple[float, ...]
    total_s: tuple[float, ...]

    @property
    def runs(self) -> int:
        return len(self.total_s)

    def rows(self) -> list[tuple[str, str, str]]:
        """(stage, mean s, best s): a shared machine makes the best run the steadier figure."""

        def row(name: str, values: tuple[float, ...]) -> tuple[str, str, str]:
            return name, f"{statistics.fmean(values):.3f}", f"{min(values):.3f}"

        return [
            row("speaker projection", self.speaker_s),
            row("encoder (embed, conformer, proj)", self.encoder_s),
            row("CFM: 10 Euler steps, batch-2 estimator", self.cfm_s),
            row("flow total", self.total_s),
        ]


def _inputs(
    flow: CausalMaskedDiffWithXvec, tokens: int, prompt_tokens: int, seed: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Random (token, prompt_token, prompt_feat, embedding) shaped like a real request."""
    cfg = flow.config
    device = next(flow.parameters()).device
    g = torch.Generator().manual_seed(seed)
    token = torch.randint(0, cfg.vocab_size, (1, tokens), generator=g)
    prompt_token = torch.randint(0, cfg.vocab_size, (1, prompt_tokens), generator=g)
    prompt_feat = torch.randn(1, cfg.token_mel_ratio * prompt_tokens, cfg.mel_bins, generator=g)
    embedding = torch.randn(1, cfg.spk_embed_dim, generator=g)
    return token.to(device), prompt_token.to(device), prompt_feat.to(device), embedding.to(device)


def _run_once(
    flow: CausalMaskedDiffWithXvec,
    inputs: tuple[Tensor, Tensor, Tensor, Tensor],
    sync: Callable[[], None],
) -> tuple[float, float, float, float, int]:
    """One `inference` call; its `stage_done` marks split the time into stages."""
    marks: dict[str, float] = {}

    def stage_done(stage: str) -> None:
        sync()
        marks[stage] = time.perf_counter()

    start = time.perf_counter()
    mel, _ = flow.inference(*inputs, stage_done=stage_done)
    speaker, encoder, cfm = marks["speaker"], marks["encoder"], marks["cfm"]
    frames = mel.size(-1) + inputs[2].size(1)  # + prompt frames
    return speaker - start, encoder - speaker, cfm - encoder, cfm - start, frames


@torch.inference_mode()
def time_flow(
    flow: CausalMaskedDiffWithXvec,
    *,
    tokens: int = DEFAULT_TOKENS,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    threads: int = DEFAULT_THREADS,
    runs: int = DEFAULT_RUNS,
    warmup: int = 1,
    seed: int = 0,
) -> FlowTiming:
    """Time `runs` inferences (after `warmup`) with `threads` intra-op threads (restored after)."""
    device = next(flow.parameters()).device
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    inputs = _inputs(flow, tokens, prompt_tokens, seed)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for _ in range(warmup):
            _run_once(flow, inputs, sync)
        samples = [_run_once(flow, inputs, sync) for _ in range(runs)]
    finally:
        torch.set_num_threads(previous)
    speaker, encoder, cfm, total, frames = zip(*samples, strict=True)
    return FlowTiming(tokens, prompt_tokens, frames[0], threads, speaker, encoder, cfm, total)


def format_flow_table(timing: FlowTiming, *, device: str, dtype: str) -> str:
    """`cosyq-worker bench flow`'s table: each stage's mean and best seconds."""
    lines = [
        f"flow, FULL size, random weights, {dtype}, device {device}, {timing.threads} threads, "
        f"{timing.tokens} tokens + {timing.prompt_tokens} prompt tokens = {timing.mel_frames} "
        f"mel frames, {timing.runs} timed runs"
    ]
    width = max(len(name) for name, _, _ in timing.rows())
    lines.append(f"  {'stage':<{width}}  {'mean s':>8}  {'best s':>8}")
    lines += [f"  {name:<{width}}  {mean:>8}  {best:>8}" for name, mean, best in timing.rows()]
    return "\n".join(lines)
