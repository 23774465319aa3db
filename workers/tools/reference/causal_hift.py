"""Parity of CosyVoice 3's causal HiFT and streaming session with the official arrays.

`check_causal_hift` (`hift_reference.npz` of the CosyVoice 3 set): F0 in float64 (relative to
the largest |F0|), source and waveform with both finalize settings, decode from the stored
fixed excitation (both settings), the tiny model's noise buffers (exact) and the REAL model's
buffer prefix and `rand_ini` (exact: regenerated from the official construction order).
`check_causal_session` (`session_reference.npz`): `CausalTokenStream` in streaming and
non-streaming mode: the call schedule, chunk lengths, speech, new mel and final source.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from workers.model.causal_hift.config import CausalHiFTConfig
from workers.model.causal_hift.model import CausalHiFTGenerator, build_causal_hift
from workers.model.causal_hift.source import SourceBuffer, official_rand_ini
from workers.model.causal_stream import CausalTokenStream, StreamChunk
from workers.model.checkpoint import read_state_dict
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.hift.model import normalize_hift_key
from workers.tools.reference.configs import causal_hift_config_from_reference
from workers.tools.reference.parity import (
    ArrayCheck,
    ReferenceSet,
    compare,
    describe_state,
    key_list_differences,
    read_key_list,
)

FILE = "hift_reference.npz"
SESSION_FILE = "session_reference.npz"
F0_RTOL = 1e-5
WAV_ATOL = 1e-4
SOURCE_ATOL = 1e-4
EXACT = 0.0
KEY_FILES = ("keys-hift.txt", "keys-hift-legacy-weightnorm.txt")
CPU = torch.device("cpu")


def load_reference_causal_hift(
    ref: ReferenceSet, device: torch.device = CPU
) -> CausalHiFTGenerator:
    """The set's tiny causal HiFT, loaded strictly through the production path."""
    config = causal_hift_config_from_reference(ref.config, "tiny")
    path = ref.checkpoint("hift")
    return build_causal_hift(config, read_state_dict(path), device=device, source=path)


def _f0_check(name: str, ours: torch.Tensor, reference: np.ndarray) -> ArrayCheck:
    scale = float(np.abs(reference).max())
    detail = f"error relative to max |f0| = {scale:.1f} Hz"
    return compare(
        f"{FILE}:{name}", ours.double() / scale, reference / scale, F0_RTOL, detail=detail
    )


@torch.inference_mode()
def check_causal_hift(ref: ReferenceSet, device: torch.device = CPU) -> list[ArrayCheck]:
    """One ArrayCheck per array of the CosyVoice 3 HiFT reference."""
    return compare_causal_hift(load_reference_causal_hift(ref, device), ref, device)


@torch.inference_mode()
def compare_causal_hift(
    model: CausalHiFTGenerator, ref: ReferenceSet, device: torch.device = CPU
) -> list[ArrayCheck]:
    """Run `model` on the stored mel and compare with every stored HiFT array."""
    a = ref.arrays(FILE)
    mel = torch.from_numpy(a["mel"]).to(device)
    s_fixed = torch.from_numpy(a["s_fixed"]).to(device)
    out = model.inference(mel)
    held = model.inference(mel, finalize=False)
    tail = a["wav_fixed_nofinalize"].shape[-1] // 480 + 5  # decode's input frames (47)
    checks = [
        _f0_check("f0_f64", out.f0, a["f0_f64"]),
        compare(f"{FILE}:f0", out.f0, a["f0"], F0_RTOL * float(np.abs(a["f0"]).max())),
        compare(f"{FILE}:source", out.source, a["source"], SOURCE_ATOL),
        compare(f"{FILE}:wav", out.wav, a["wav"], WAV_ATOL),
        _f0_check("f0_nofinalize_f64", held.f0, a["f0_nofinalize_f64"]),
        compare(f"{FILE}:source_nofinalize", held.source, a["source_nofinalize"], SOURCE_ATOL),
        compare(f"{FILE}:wav_nofinalize", held.wav, a["wav_nofinalize"], WAV_ATOL),
        compare(f"{FILE}:wav_fixed", model.decode(mel, s_fixed), a["wav_fixed"], WAV_ATOL),
        compare(
            f"{FILE}:wav_fixed_nofinalize",
            model.decode(mel[:, :, :tail], s_fixed[..., : tail * 480], finalize=False),
            a["wav_fixed_nofinalize"],
            WAV_ATOL,
        ),
        compare(f"{FILE}:s_fixed", s_fixed, a["s_fixed"], EXACT),
    ]
    return checks + _buffer_checks(model.config, ref, a)


def _buffer_checks(
    tiny: CausalHiFTConfig, ref: ReferenceSet, a: dict[str, np.ndarray]
) -> list[ArrayCheck]:
    """The tiny and the REAL model's fixed source buffers, regenerated (never stored)."""
    full = causal_hift_config_from_reference(ref.config, "full")
    real_prefix = a["real_model_sine_waves_first2400"]
    tiny_prefix = a["tiny_sine_waves_prefix"]
    return [
        compare(f"{FILE}:tiny_rand_ini", official_rand_ini(tiny), a["tiny_rand_ini"], EXACT),
        compare(
            f"{FILE}:tiny_sine_waves_prefix",
            SourceBuffer(tiny).prefix(tiny_prefix.shape[1]),
            tiny_prefix,
            EXACT,
        ),
        compare(
            f"{FILE}:real_model_rand_ini", official_rand_ini(full), a["real_model_rand_ini"], EXACT
        ),
        compare(
            f"{FILE}:real_model_sine_waves_first2400",
            SourceBuffer(full).prefix(real_prefix.shape[1]),
            real_prefix,
            EXACT,
        ),
    ]


def _session_chunks(
    flow: CausalMaskedDiffWithDiT, hift: CausalHiFTGenerator, a: dict[str, np.ndarray], stream: bool
) -> list[StreamChunk]:
    state = CausalTokenStream(
        flow,
        hift,
        torch.from_numpy(a["prompt_token"]).long(),
        torch.from_numpy(a["prompt_feat"]),
        torch.from_numpy(a["embedding"]),
        streaming=stream,
    )
    chunks = list(state.feed([int(t) for t in a["session_source_token"][0]]))
    return [*chunks, state.finish()]


def check_causal_session(
    ref: ReferenceSet, flow: CausalMaskedDiffWithDiT, hift: CausalHiFTGenerator
) -> list[ArrayCheck]:
    """Streaming and non-streaming synthesis of the stored token stream, chunk by chunk."""
    a = ref.arrays(SESSION_FILE)
    checks = []
    for mode, stream in (("stream", True), ("nonstream", False)):
        chunks = _session_chunks(flow, hift, a, stream)
        calls = [[c.call.tokens, c.call.offset, c.call.finalize, c.call.streaming] for c in chunks]
        lengths = [c.speech.size(1) for c in chunks]
        prefix = f"{Path(SESSION_FILE).stem}:session_{mode}"
        checks += [
            compare(f"{prefix}_calls", np.array(calls), a[f"session_{mode}_calls"], EXACT),
            compare(
                f"{prefix}_chunk_len", np.array(lengths), a[f"session_{mode}_chunk_len"], EXACT
            ),
            compare(
                f"{prefix}_speech",
                torch.cat([c.speech for c in chunks], dim=1),
                a[f"session_{mode}_speech"],
                WAV_ATOL,
            ),
            compare(
                f"{prefix}_mel",
                torch.cat([c.mel for c in chunks], dim=2),
                a[f"session_{mode}_mel"],
                1e-3,
            ),
            compare(
                f"{prefix}_final_source",
                chunks[-1].source,
                a[f"session_{mode}_final_source"],
                SOURCE_ATOL,
            ),
        ]
    return checks


def causal_hift_key_differences(config: CausalHiFTConfig, keys_file: Path) -> list[str]:
    """Our state dict (built on meta) against a key listing, after the loader's renaming, as
    stored and with a `generator.` prefix on every key; [] = equal."""
    with torch.device("meta"):
        ours = describe_state(CausalHiFTGenerator(config).state_dict())
    listing = read_key_list(keys_file)
    problems: list[str] = []
    for prefix in ("", "generator."):
        renamed = [(normalize_hift_key(prefix + k), s, d) for k, s, d in listing]
        problems += key_list_differences(
            ours, renamed, f"{keys_file.name} ({prefix or 'as stored'})"
        )
    return problems
