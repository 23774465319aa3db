"""Speed of the flow stage at FULL size with random weights (issue 4 "Bench").

`random_flow(config)` builds the architecture through the production loader (`build_flow`) from
a seeded random state dict (normal(0, 0.02) weights, zero biases, unit LayerNorms), so no real
checkpoint is needed. `time_flow(flow)` runs the three stages the way `inference` chains them
(speaker projection, encoder, CFM solve) and returns their times; `main()` prints a table.
Timings on a shared machine are noisy: compare runs made back to back.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from workers.model.flow import CausalMaskedDiffWithXvec, build_flow
from workers.model.flow_config import FlowConfig

DEFAULT_TOKENS = 100  # issue 4: 100 generated tokens (4 s of audio) ...
DEFAULT_PROMPT_TOKENS = 50  # ... after 50 prompt tokens: 300 mel frames through the CFM
DEFAULT_THREADS = 2
DEFAULT_RUNS = 3
INIT_STD = 0.02


def random_state_dict(config: FlowConfig, seed: int = 0) -> dict[str, Tensor]:
    """A state dict with the official keys and shapes and cheap, well-scaled random values."""
    with torch.device("meta"):
        shapes = CausalMaskedDiffWithXvec(config)
    norms = {
        f"{name}.{p}"
        for name, module in shapes.named_modules()
        if isinstance(module, nn.LayerNorm)
        for p in ("weight", "bias")
    }
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for key, meta in shapes.state_dict().items():
        if key in norms:
            fill = 1.0 if key.endswith("weight") else 0.0
            state[key] = torch.full(meta.shape, fill)
        elif key.endswith("bias"):
            state[key] = torch.zeros(meta.shape)
        else:
            state[key] = torch.randn(meta.shape, generator=generator) * INIT_STD
    return state


def random_flow(
    config: FlowConfig | None = None,
    *,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> CausalMaskedDiffWithXvec:
    """The flow (FULL size by default) with random weights, loaded like a real checkpoint."""
    config = config or FlowConfig()
    return build_flow(config, random_state_dict(config, seed), device=device, dtype=dtype)


@dataclass(frozen=True)
class FlowTiming:
    """Mean seconds per stage over the timed runs (after warm-up)."""

    tokens: int
    prompt_tokens: int
    mel_frames: int
    threads: int
    runs: int
    speaker_s: float
    encoder_s: float
    cfm_s: float
    total_s: float

    @property
    def estimator_call_s(self) -> float:
        """One batch-of-2 estimator call (the CFM makes n_timesteps of them)."""
        return self.cfm_s / 10

    def rows(self) -> list[tuple[str, str]]:
        return [
            ("tokens + prompt tokens", f"{self.tokens} + {self.prompt_tokens}"),
            ("mel frames through the CFM", str(self.mel_frames)),
            ("threads / timed runs", f"{self.threads} / {self.runs}"),
            ("speaker projection s", f"{self.speaker_s:.4f}"),
            ("encoder (embed, conformer, proj) s", f"{self.encoder_s:.3f}"),
            ("CFM, 10 Euler steps x batch-2 estimator s", f"{self.cfm_s:.3f}"),
            ("flow total s", f"{self.total_s:.3f}"),
        ]


def _inputs(
    flow: CausalMaskedDiffWithXvec, tokens: int, prompt_tokens: int, seed: int
) -> dict[str, Tensor]:
    cfg = flow.config
    device = next(flow.parameters()).device
    g = torch.Generator().manual_seed(seed)
    return {
        "token": torch.randint(0, cfg.vocab_size, (1, tokens), generator=g).to(device),
        "prompt_token": torch.randint(0, cfg.vocab_size, (1, prompt_tokens), generator=g).to(
            device
        ),
        "prompt_feat": torch.randn(
            1, cfg.token_mel_ratio * prompt_tokens, cfg.mel_bins, generator=g
        ).to(device),
        "embedding": torch.randn(1, cfg.spk_embed_dim, generator=g).to(device),
    }


def _run_once(
    flow: CausalMaskedDiffWithXvec, inputs: dict[str, Tensor], sync: Callable[[], None]
) -> tuple[float, float, float, float, int]:
    """One inference, stage by stage, with the same calls `inference` makes."""
    dtype = next(flow.parameters()).dtype
    start = time.perf_counter()
    spks = flow.project_speaker(inputs["embedding"].to(dtype))
    sync()
    after_speaker = time.perf_counter()
    tokens = torch.cat([inputs["prompt_token"], inputs["token"]], dim=1)
    _, mu = flow.encode(tokens)
    sync()
    after_encoder = time.perf_counter()
    frames, prompt_frames = mu.size(1), inputs["prompt_feat"].size(1)
    cond = torch.zeros(1, frames, flow.config.mel_bins, dtype=mu.dtype, device=mu.device)
    cond[:, :prompt_frames] = inputs["prompt_feat"].to(mu.dtype)
    mask = torch.ones(1, 1, frames, dtype=mu.dtype, device=mu.device)
    noise = flow.decoder.noise(frames).to(mu.device, mu.dtype)
    mel = flow.decoder.solve(noise, mu.transpose(1, 2), mask, spks, cond.transpose(1, 2))
    mel = mel[:, :, prompt_frames:].float()
    sync()
    end = time.perf_counter()
    return (
        after_speaker - start,
        after_encoder - after_speaker,
        end - after_encoder,
        end - start,
        frames,
    )


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
    mean = [statistics.fmean(column) for column in zip(*samples, strict=True)]
    return FlowTiming(
        tokens, prompt_tokens, samples[0][4], threads, runs, mean[0], mean[1], mean[2], mean[3]
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time the FULL-size flow with random weights")
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS)
    parser.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS)
    parser.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    flow = random_flow(device=args.device)
    timing = time_flow(
        flow,
        tokens=args.tokens,
        prompt_tokens=args.prompt_tokens,
        threads=args.threads,
        runs=args.runs,
    )
    width = max(len(name) for name, _ in timing.rows())
    print(f"flow, FULL size, random weights, fp32, device {args.device}")
    for name, value in timing.rows():
        print(f"  {name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
