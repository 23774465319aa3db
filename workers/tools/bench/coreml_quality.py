"""Output quality of converted weights, measured in PyTorch (works on Linux).

A variant's packages are decompressed, their weights copied into fresh copies of our flow and
HiFT modules by name, and the same request (tokens, prompt, speaker, CFM noise, source noise)
is synthesized by those copies and by the float32 originals. Reported: SNR of the waveform in
dB, end to end and with only the vocoder's weights changed (a waveform's SNR collapses as soon
as the f0 and so the sine phase drifts, which says little about how it sounds), mean |Δ| of the
flow's log-mel output, mean |Δ| of the log-mel of the two waveforms, and how much of the
weights the packages covered (the rest keep their float32 values).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn

from workers.coreml.convert.compress import load_into
from workers.coreml.convert.graphs import flow_graphs, hift_graphs
from workers.coreml.stages import FLOW_CFM, FLOW_ENCODER, HIFT_DECODE, HIFT_SOURCE
from workers.model.features import MelConfig, prompt_mel
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.hift.model import HiFTGenerator
from workers.model.hift.source import SourceNoise, draw_source_noise


@dataclass(frozen=True)
class BenchRequest:
    """One fixed synthesis request; every variant gets exactly these inputs."""

    token: Tensor  # (1, N)
    prompt_token: Tensor  # (1, P)
    prompt_feat: Tensor  # (1, 2P, 80)
    embedding: Tensor  # (1, 192)
    source_noise: SourceNoise  # (1, 9) and (1, 9, 480·2N)


def bench_request(
    flow: CausalMaskedDiffWithXvec, hift: HiFTGenerator, tokens: int, prompt_tokens: int, seed: int
) -> BenchRequest:
    """Random request shaped like a real one (seeded); its source noise covers the output."""
    cfg = flow.config
    g = torch.Generator().manual_seed(seed)
    samples = cfg.token_mel_ratio * tokens * hift.config.samples_per_frame
    return BenchRequest(
        torch.randint(0, cfg.vocab_size, (1, tokens), generator=g),
        torch.randint(0, cfg.vocab_size, (1, prompt_tokens), generator=g),
        torch.randn(1, cfg.token_mel_ratio * prompt_tokens, cfg.mel_bins, generator=g),
        torch.randn(1, cfg.spk_embed_dim, generator=g),
        draw_source_noise(1, hift.m_source.harmonics, samples, generator=g),
    )


@torch.inference_mode()
def synthesize(
    flow: CausalMaskedDiffWithXvec, hift: HiFTGenerator, request: BenchRequest
) -> tuple[Tensor, Tensor]:
    """(mel (1, 80, 2N), wav (1, 480·2N)) for `request`, in PyTorch."""
    mel, _ = flow.inference(
        request.token, request.prompt_token, request.prompt_feat, request.embedding
    )
    return mel, hift.inference(mel, noise=request.source_noise).wav


def snr_db(reference: Tensor, other: Tensor) -> float:
    """10·log10(Σ ref² / Σ (ref − other)²); +inf when identical."""
    noise = float(((reference.double() - other.double()) ** 2).sum())
    signal = float((reference.double() ** 2).sum())
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


@dataclass(frozen=True)
class Quality:
    snr_db: float  # end to end: the variant's flow and HiFT
    hift_snr_db: float  # the variant's HiFT on the float32 flow's mel (same f0, same phase)
    flow_mel_l1: float  # mean |Δ log-mel| of the flow output
    wav_mel_l1: float  # mean |Δ log-mel| of the waveforms (Matcha features)
    coverage: float  # fraction of flow + HiFT parameter elements the packages supplied
    finite: bool


def variant_modules(
    flow: CausalMaskedDiffWithXvec, hift: HiFTGenerator, weights: dict[str, dict[str, np.ndarray]]
) -> tuple[CausalMaskedDiffWithXvec, HiFTGenerator, float]:
    """Copies of `flow` and `hift` carrying the packages' weights, + coverage; `weights`: each
    stage's `decompressed_weights`."""
    flow_v, hift_v = copy.deepcopy(flow), copy.deepcopy(hift)
    fg, hg = flow_graphs(flow_v), hift_graphs(hift_v)
    graphs: dict[str, nn.Module] = {FLOW_ENCODER: fg.encoder, FLOW_CFM: fg.cfm}
    graphs |= {HIFT_SOURCE: hg.source, HIFT_DECODE: hg.decode}
    loaded: set[int] = set()  # id() of every parameter a package supplied
    for stage, stage_weights in weights.items():
        params = dict(graphs[stage].named_parameters())
        loaded |= {id(params[n]) for n in load_into(graphs[stage], stage_weights)}
    everything = [*flow_v.parameters(), *hift_v.parameters()]
    covered = sum(p.numel() for p in everything if id(p) in loaded)
    return flow_v, hift_v, covered / sum(p.numel() for p in everything)


def measure(
    reference: tuple[Tensor, Tensor],
    flow_v: CausalMaskedDiffWithXvec,
    hift_v: HiFTGenerator,
    *,
    request: BenchRequest,
    mel_config: MelConfig,
    weight_coverage: float,
) -> Quality:
    """Quality of the variant modules against the float32 `reference` (mel, wav)."""
    mel_ref, wav_ref = reference
    mel, wav = synthesize(flow_v, hift_v, request)
    with torch.inference_mode():
        spec_ref, spec = prompt_mel(wav_ref, mel_config), prompt_mel(wav, mel_config)
        wav_hift = hift_v.inference(mel_ref, noise=request.source_noise).wav
    finite = all(bool(torch.isfinite(x).all()) for x in (mel, wav, wav_hift))
    return Quality(
        snr_db(wav_ref, wav),
        snr_db(wav_ref, wav_hift),
        float((mel - mel_ref).abs().mean()),
        float((spec - spec_ref).abs().mean()),
        weight_coverage,
        finite,
    )
