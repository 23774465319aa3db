"""Audio-feature parity with upstream's front end (`mel_reference.npz`, `frontend_reference.npz`).

Log features cannot be matched tightly next to their floors (README: the stored arrays carry
float32 FFT rounding that the log magnifies there), so each is checked twice: tightly on the
entries well above the floor and loosely on all entries, with the README's tolerances.

Order: our own filterbanks and windows against the stored ones; then every feature from the
stored 16 kHz / 24 kHz signals; then end to end from the prompt as read from the file, through
our resampler. Rows that pass through our resampler are gated only when it is provably
upstream's filter for the set's rate, i.e. our kernel equals the stored `resample_kernel_16k`
(otherwise they are printed for information). A 24 kHz prompt reaches the mel unresampled.
"""

from __future__ import annotations

import numpy as np
import torch

from workers.model.features import (
    KALDI_FRAME,
    KALDI_N_MELS,
    WHISPER_N_FFT,
    WHISPER_N_MELS,
    MelConfig,
    kaldi_fbank,
    kaldi_filterbank,
    prompt_mel,
    speaker_fbank,
    whisper_log_mel,
)
from workers.model.mel_filters import hann_window, povey_window, slaney_mel_filterbank
from workers.model.prompt_features import PROMPT_MODELS_SAMPLE_RATE, extract_prompt_features
from workers.model.resample import resample, sinc_resample_kernel
from workers.tools.reference.configs import mel_config_from_reference
from workers.tools.reference.parity import ArrayCheck, ReferenceSet, compare

MEL_FILE = "mel_reference.npz"
FRONTEND_FILE = "frontend_reference.npz"
MEL_FLOOR_MASK = -9.0  # tight check on mel entries above this (ln 1e-5 = -11.5)
MEL_ATOL, MEL_ATOL_ALL = 1e-3, 2e-2
WHISPER_ATOL = 2e-4
FBANK_FLOOR_MASK = -10.0  # tight where fbank80_nomean is above this (ln eps = -15.9)
FBANK_ATOL, FBANK_ATOL_ALL = 5e-4, 3e-2
FBANK_NOMEAN_MASK, FBANK_NOMEAN_ATOL = -5.0, 1e-4
WAV_ATOL = 1e-6  # resampled signals (README, with the float32 phase offset reproduced)
KERNEL_ATOL = 1e-7  # float32 taps <= 1: equal up to one float64 -> float32 rounding
TABLE_ATOL = 1e-7  # filterbanks and windows
# Kaldi's triangles are built from float32 mel values (up to ~2,840 mel, one ulp = 2.4e-4) over
# bins ~35 mel wide, so one ulp of torch's float32 log moves a weight by ~7e-6; vectorised log
# differs by that ulp between CPUs (seen: 41 of 20,560 weights at 7.1e-6), and the reference
# README gives 1.4e-5 for a float64 build. The fbank features built from them stay gated below.
KALDI_BANK_ATOL = 2e-5


def check_features(ref: ReferenceSet) -> list[ArrayCheck]:
    """Rows for mel_reference.npz, plus frontend_reference.npz when the set has it."""
    config = mel_config_from_reference(ref.config)
    checks = _check_mel_file(ref.arrays(MEL_FILE), config)
    if ref.has(FRONTEND_FILE):
        arrays = ref.arrays(FRONTEND_FILE)
        kernel_checks, same_filter = _check_resampler(arrays)
        checks += _check_tables(arrays) + kernel_checks
        for i in _signal_indices(arrays):
            checks += _check_from_stored(arrays, i, config, same_filter)
            checks += _check_end_to_end(arrays, i, config, same_filter)
    return checks


def _floored_rows(
    name: str,
    ours: torch.Tensor,
    reference: np.ndarray,
    tight: tuple[np.ndarray, str, float],
    loose: float,
    *,
    gated: bool = True,
    detail: str = "",
) -> list[ArrayCheck]:
    """A log feature: `tight` = (mask, mask text, atol) above the floor, `loose` on all."""
    mask, mask_text, atol = tight
    return [
        compare(f"{name}[{mask_text}]", ours, reference, atol, where=mask, gated=gated,
                detail=detail),
        compare(name, ours, reference, loose, gated=gated, detail=detail),
    ]  # fmt: skip


def _mel_rows(
    name: str, ours: torch.Tensor, reference: np.ndarray, *, gated: bool = True, detail: str = ""
) -> list[ArrayCheck]:
    tight = (reference > MEL_FLOOR_MASK, f"> {MEL_FLOOR_MASK:g}", MEL_ATOL)
    return _floored_rows(name, ours, reference, tight, MEL_ATOL_ALL, gated=gated, detail=detail)


def _fbank_rows(
    name: str, ours: torch.Tensor, arrays: dict[str, np.ndarray], i: int, *,
    gated: bool = True, detail: str = "",
) -> list[ArrayCheck]:  # fmt: skip
    mask = arrays[f"fbank80_nomean_{i}"][None] > FBANK_FLOOR_MASK
    tight = (mask, f"nomean > {FBANK_FLOOR_MASK:g}", FBANK_ATOL)
    return _floored_rows(
        name, ours, arrays[f"fbank80_{i}"], tight, FBANK_ATOL_ALL, gated=gated, detail=detail
    )


def _check_mel_file(arrays: dict[str, np.ndarray], config: MelConfig) -> list[ArrayCheck]:
    bank = slaney_mel_filterbank(
        config.sampling_rate, config.n_fft, config.num_mels, config.fmin, config.fmax
    )
    window_name = f"hann_window_{config.win_size}"
    checks = [
        compare(f"{MEL_FILE}:mel_filterbank", bank, arrays["mel_filterbank"], TABLE_ATOL),
        compare(
            f"{MEL_FILE}:{window_name}",
            hann_window(config.win_size),
            arrays[window_name],
            TABLE_ATOL,
        ),
    ]
    index = 1
    while f"wav{index}" in arrays:
        ours = prompt_mel(torch.from_numpy(arrays[f"wav{index}"]), config)
        checks += _mel_rows(f"{MEL_FILE}:mel{index}", ours, arrays[f"mel{index}"])
        index += 1
    return checks


def _signal_indices(arrays: dict[str, np.ndarray]) -> list[int]:
    return sorted(int(k.rsplit("_", 1)[1]) for k in arrays if k.startswith("wav_in_"))


def _check_tables(arrays: dict[str, np.ndarray]) -> list[ArrayCheck]:
    whisper_bank = slaney_mel_filterbank(PROMPT_MODELS_SAMPLE_RATE, WHISPER_N_FFT, WHISPER_N_MELS)
    tables: dict[str, np.ndarray | torch.Tensor] = {
        f"whisper_mel_filters_{WHISPER_N_MELS}": whisper_bank,
        f"whisper_hann_{WHISPER_N_FFT}": hann_window(WHISPER_N_FFT),
        f"kaldi_mel_banks_{KALDI_N_MELS}": kaldi_filterbank(),
        f"kaldi_povey_window_{KALDI_FRAME}": povey_window(KALDI_FRAME),
    }
    kaldi_banks = f"kaldi_mel_banks_{KALDI_N_MELS}"
    return [
        compare(
            f"{FRONTEND_FILE}:{key}",
            ours,
            arrays[key],
            KALDI_BANK_ATOL if key == kaldi_banks else TABLE_ATOL,
            detail="our own",
        )
        for key, ours in tables.items()
    ]


def _check_resampler(arrays: dict[str, np.ndarray]) -> tuple[list[ArrayCheck], bool]:
    """Our kernel vs the stored one; True when that proves our filter is upstream's."""
    rates = {int(arrays[f"sample_rate_in_{i}"]) for i in _signal_indices(arrays)}
    if "resample_kernel_16k" not in arrays or len(rates) != 1:
        return [], False
    rate = rates.pop()
    kernel, width = sinc_resample_kernel(rate, PROMPT_MODELS_SAMPLE_RATE)
    detail = f"{rate} -> {PROMPT_MODELS_SAMPLE_RATE} Hz"
    checks = [
        compare(f"{FRONTEND_FILE}:resample_kernel_16k", kernel, arrays["resample_kernel_16k"],
                KERNEL_ATOL, detail=detail),
        compare(f"{FRONTEND_FILE}:resample_width_16k", np.array(width),
                arrays["resample_width_16k"], 0.0, detail=detail),
    ]  # fmt: skip
    return checks, all(c.passed for c in checks)


def _check_from_stored(
    arrays: dict[str, np.ndarray], i: int, config: MelConfig, same_filter: bool
) -> list[ArrayCheck]:
    name, rate = FRONTEND_FILE, int(arrays[f"sample_rate_in_{i}"])
    wav_in = torch.from_numpy(arrays[f"wav_in_{i}"])
    wav16k = torch.from_numpy(arrays[f"wav16k_{i}"])
    feats, lengths = whisper_log_mel(wav16k)
    nomean = arrays[f"fbank80_nomean_{i}"]
    speech_feat = prompt_mel(torch.from_numpy(arrays[f"wav24k_{i}"]), config).transpose(1, 2)
    mel_direct = rate == config.sampling_rate
    return [
        compare(f"{name}:wav16k_{i}", resample(wav_in, rate, PROMPT_MODELS_SAMPLE_RATE),
                arrays[f"wav16k_{i}"], WAV_ATOL, gated=same_filter,
                detail=_resampler_text(rate, PROMPT_MODELS_SAMPLE_RATE, same_filter)),
        compare(f"{name}:wav24k_{i}", resample(wav_in, rate, config.sampling_rate),
                arrays[f"wav24k_{i}"], WAV_ATOL, gated=mel_direct,
                detail=_resampler_text(rate, config.sampling_rate, mel_direct)),
        compare(f"{name}:whisper_logmel128_{i}", feats, arrays[f"whisper_logmel128_{i}"],
                WHISPER_ATOL, detail="from stored wav16k"),
        compare(f"{name}:whisper_feats_length_{i}", lengths,
                arrays[f"whisper_feats_length_{i}"], 0.0),
        compare(f"{name}:fbank80_nomean_{i}[> {FBANK_NOMEAN_MASK:g}]", kaldi_fbank(wav16k[0]),
                nomean, FBANK_NOMEAN_ATOL, where=nomean > FBANK_NOMEAN_MASK,
                detail="from stored wav16k"),
        *_fbank_rows(f"{name}:fbank80_{i}", speaker_fbank(wav16k), arrays, i,
                     detail="from stored wav16k"),
        *_mel_rows(f"{name}:speech_feat_{i}", speech_feat, arrays[f"speech_feat_{i}"],
                   detail="from stored wav24k"),
    ]  # fmt: skip


def _resampler_text(rate: int, target: int, verified: bool) -> str:
    if rate == target:
        return "no resampling needed"
    if verified:
        return f"our sinc resampler {rate} -> {target} Hz; its kernel equals upstream's"
    return f"our sinc resampler {rate} -> {target} Hz; no stored kernel: info only"


def _check_end_to_end(
    arrays: dict[str, np.ndarray], i: int, config: MelConfig, same_filter: bool
) -> list[ArrayCheck]:
    name, rate = FRONTEND_FILE, int(arrays[f"sample_rate_in_{i}"])
    ours = extract_prompt_features(arrays[f"wav_in_{i}"], rate, config)
    to16k = "end to end: " + _resampler_text(rate, PROMPT_MODELS_SAMPLE_RATE, same_filter)
    mel_direct = rate == config.sampling_rate
    to24k = "end to end: " + _resampler_text(rate, config.sampling_rate, mel_direct)
    return [
        compare(f"{name}:whisper_logmel128_{i}[end to end]", ours.tokenizer_feats,
                arrays[f"whisper_logmel128_{i}"], WHISPER_ATOL, gated=same_filter,
                detail=to16k),
        compare(f"{name}:whisper_feats_length_{i}[end to end]", ours.tokenizer_feats_length,
                arrays[f"whisper_feats_length_{i}"], 0.0, gated=same_filter, detail=to16k),
        *_fbank_rows(f"{name}:fbank80_{i}[end to end]", ours.speaker_fbank, arrays, i,
                     gated=same_filter, detail=to16k),
        *_mel_rows(f"{name}:speech_feat_{i}[end to end]", ours.speech_feat,
                   arrays[f"speech_feat_{i}"], gated=mel_direct, detail=to24k),
    ]  # fmt: skip
