"""`cosyq-worker bench flow --flow-precision int8`: the FULL flow (CosyVoice 2, random weights)
in fp32, bf16, and each with its transformer products in int8 through ONNX Runtime
(`workers.model.flow.int8_products`), timed in interleaved rounds in one process, each mel's
SNR against fp32's.

One call is `flow.inference` on `tokens` after `prompt_tokens` (the speaker projection, the
encoder and the 10-step CFM solve), as `bench flow` times it; each flow's best and median round
and its ratio to bf16's best (the precision `auto` picks on AVX512-BF16 and AMX hosts).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch

from workers.model.flow.int8_products import quantize_products
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.kernel_policy import apply_stage_policy, kernel_policy
from workers.tools.bench.flow_stage import _inputs
from workers.tools.fixtures.random_weights import random_flow

VARIANTS = {  # name -> (dtype, int8 products)
    "fp32": (torch.float32, False),
    "bf16": (torch.bfloat16, False),
    "bf16, products int8": (torch.bfloat16, True),
    "fp32, products int8": (torch.float32, True),
}


@dataclass(frozen=True)
class FlowPrecisionRow:
    name: str
    seconds: tuple[float, ...]  # one per round
    mel_db: float  # against fp32's mel

    def line(self, bf16_best: float) -> str:
        rounds = " / ".join(f"{s:.2f}" for s in self.seconds)
        return (
            f"| {self.name} | {min(self.seconds):.2f} | {statistics.median(self.seconds):.2f} | "
            f"{rounds} | {min(self.seconds) / bf16_best:.2f} | {self.mel_db:.1f} |"
        )


def _flow(dtype: torch.dtype, int8: bool, threads: int) -> CausalMaskedDiffWithXvec:
    flow = random_flow(dtype=dtype)
    apply_stage_policy(flow, kernel_policy(torch.device("cpu"), dtype), rows_alone=True)
    if int8:
        quantize_products(flow.decoder.estimator, threads=threads)
    return flow


def _snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    error = float(((reference.double() - other.double()) ** 2).sum())
    return (
        math.inf if error == 0 else 10 * math.log10(float((reference.double() ** 2).sum()) / error)
    )


@torch.inference_mode()
def compare_flow_precisions(
    *, tokens: int, prompt_tokens: int, threads: int, rounds: int
) -> list[FlowPrecisionRow]:
    """Each variant's seconds per round (after one untimed call) and mel SNR against fp32."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        flows = {name: _flow(dtype, int8, threads) for name, (dtype, int8) in VARIANTS.items()}
        token, prompt_token, prompt_feat, embedding = _inputs(
            flows["fp32"], tokens, prompt_tokens, 0
        )

        def call(name: str) -> torch.Tensor:
            dtype = VARIANTS[name][0]
            args = (token, prompt_token, prompt_feat.to(dtype), embedding.to(dtype))
            return flows[name].inference(*args)[0]

        mels = {name: call(name) for name in flows}
        seconds: dict[str, list[float]] = {name: [] for name in flows}
        for _ in range(rounds):
            for name in flows:
                start = time.perf_counter()
                call(name)
                seconds[name].append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return [
        FlowPrecisionRow(name, tuple(seconds[name]), _snr_db(mels["fp32"], mels[name]))
        for name in flows
    ]


def format_rows(rows: list[FlowPrecisionRow]) -> list[str]:
    bf16 = min(next(r for r in rows if r.name == "bf16").seconds)
    head = [
        "| flow | best s | median s | rounds s | best / bf16 | mel SNR vs fp32 dB |",
        "|---|---|---|---|---|---|",
    ]
    return head + [row.line(bf16) for row in rows]
