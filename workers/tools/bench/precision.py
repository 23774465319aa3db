"""How far a lower-precision engine's output is from fp32's, stage by stage, as SNR in dB.

Sampling makes whole utterances incomparable (one different token changes everything after
it), so each stage gets identical inputs in both precisions: the LLM's first-step log-probs
for the same prefix; the flow's mel for the same speech tokens and prompt; HiFT's waveform for
the same (fp32) mel and the same source noise; and the flow + HiFT chain for the same tokens.
SNR = 10·log10(Σ ref² / Σ (ref − low)²); log-probs are centred first (their mean, about
−ln(vocabulary), is no signal). With random weights the numbers show the arithmetic's
error, not audible quality; measure a real model with `--model-dir`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.causal_stages import CausalVocoder
from workers.engine.pipeline import SynthesisPipeline
from workers.engine.stages import ModuleFlow, ModuleSpeechTokens, ModuleVocoder, source_noise
from workers.model.llm.qwen2 import KVCache
from workers.tools.bench.llm_agreement import LLMAgreement, compare_llm, free_running


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    """10·log10(signal / error) over matching lengths; inf when identical."""
    n = min(reference.size, other.size)
    ref = reference.reshape(-1)[:n].astype(np.float64)
    error = float(np.sum((ref - other.reshape(-1)[:n].astype(np.float64)) ** 2))
    signal = float(np.sum(ref**2))
    return math.inf if error == 0 else 10 * math.log10(signal / error)


@dataclass(frozen=True)
class PrecisionReport:
    dtype: str
    llm_logp_db: float
    flow_mel_db: float
    hift_wav_db: float
    hift_decoder_db: float | None  # None: a causal HiFT (its excitation is a fixed buffer)
    chain_wav_db: float
    llm_agreement: LLMAgreement | None = None  # int8 LLM: 200 teacher-forced steps

    def lines(self) -> list[str]:
        rows = [
            ("LLM first-step log-probs (centred)", self.llm_logp_db),
            ("flow mel (same tokens)", self.flow_mel_db),
            ("HiFT waveform (same mel, same noise)", self.hift_wav_db),
            ("HiFT decoder (same mel, same fp32 excitation)", self.hift_decoder_db),
            ("flow + HiFT waveform (same tokens)", self.chain_wav_db),
        ]
        width = max(len(name) for name, _ in rows)
        head = f"{self.dtype} vs fp32, SNR dB (identical inputs per stage)"
        lines = [head, *(f"{name:<{width}}  {_db(value)}" for name, value in rows)]
        return lines + (self.llm_agreement.lines() if self.llm_agreement else [])


def _db(value: float | None) -> str:
    return f"{value:8.1f}" if value is not None else "     n/a"


@torch.inference_mode()
def first_step_logp(
    engine: SynthesisPipeline,
    text: list[int],
    prompt: VoicePrompt,
    prompt_text: list[int] | None = None,
) -> np.ndarray:
    """The LLM's centred log-probs after prefilling `prompt_text` (none by default) and `text`
    on `prompt`'s speech tokens."""
    llm = engine.llm
    if not isinstance(llm, ModuleSpeechTokens):
        raise TypeError("the precision check needs the torch LLM stage")
    model = llm.model
    texts = (text, prompt_text or [])
    ids = [torch.as_tensor(x, dtype=torch.long, device=model.device) for x in texts]
    speech = torch.from_numpy(prompt.speech_tokens.astype(np.int64)).to(model.device)
    prefix = model.prefix_embeddings(ids[0], ids[1], speech)
    cache = KVCache(
        model.config.backbone, prefix.shape[1], device=prefix.device, dtype=prefix.dtype
    )
    logp = model.step_logp(prefix, cache).float().cpu().numpy()
    return logp - logp.mean()


@torch.inference_mode()
def llm_agreement(
    reference: SynthesisPipeline,
    other: SynthesisPipeline,
    request: Any,
    *,
    steps: int,
    seed: int,
) -> LLMAgreement:
    """`other`'s LLM against `reference`'s over a prefill of `request`'s text and voice and
    `steps` teacher-forced steps (`llm_agreement.compare_llm`), and the same seed's
    free-running draws (`llm_agreement.free_running`)."""
    ref, low = reference.llm, other.llm
    if not (isinstance(ref, ModuleSpeechTokens) and isinstance(low, ModuleSpeechTokens)):
        raise TypeError("the LLM agreement check needs module LLM stages")
    plan = reference.begin(request)  # the family's own prompt (CosyVoice 3: its system text)
    ids = torch.as_tensor(list(plan.pieces[0].ids))
    prompt_text = torch.as_tensor(plan.prompt.text_ids, dtype=torch.long)
    speech = torch.from_numpy(plan.prompt.speech_tokens.astype(np.int64))
    prefix = ref.model.prefix_embeddings(ids, prompt_text, speech)
    forced = compare_llm(ref.model, low.model, prefix, steps=steps, seed=seed)
    free = free_running(ref.model, low.model, prefix, steps=steps, seed=seed)
    return dataclasses.replace(forced, free=free)


@torch.inference_mode()
def _decoder_snr(reference: ModuleVocoder, low: ModuleVocoder, mel: np.ndarray) -> float:
    """HiFT's decoder alone: both precisions get the fp32 model's f0 and excitation, so a
    small f0 difference (whose phase drift swamps a waveform SNR) does not count."""
    ref_model, low_model = reference.model, low.model
    mel_ref = torch.from_numpy(mel)[None].to(reference.device)
    samples = mel.shape[-1] * reference.config.samples_per_frame
    generator = torch.Generator().manual_seed(0)
    noise = source_noise(ref_model.m_source.harmonics, samples, generator, reference.device)
    source = ref_model.m_source(ref_model.f0_predictor(mel_ref), noise.normal)
    wav_ref = ref_model.decode(mel_ref, source)
    dtype = low_model.conv_pre.weight.dtype
    wav_low = low_model.decode(mel_ref.to(low.device, dtype), source.to(low.device))
    return snr_db(wav_ref.float().cpu().numpy(), wav_low.float().cpu().numpy())


def compare_precision(
    reference: SynthesisPipeline,
    low: SynthesisPipeline,
    *,
    dtype: str,
    request: SynthesisInput,
    tokens: int,
    seed: int = 0,
) -> PrecisionReport:
    """SNR of `low` against the fp32 `reference` engine on identical inputs per stage: the
    request's first piece with the LLM prompt its mode and family give (as a job runs it)."""
    plan = reference.begin(request)
    ids, prompt_text, voice = list(plan.pieces[0].ids), plan.prompt.text_ids, request.prompt
    speech = reference.llm.generate(
        ids,
        prompt_text=prompt_text,
        prompt_speech=plan.prompt.speech_tokens,
        generator=torch.Generator().manual_seed(seed),
        forced_length=tokens,
    ).ids
    ref_flow, low_flow, ref_vocoder, low_vocoder = (
        reference.flow,
        low.flow,
        reference.vocoder,
        low.vocoder,
    )
    vocoders = (ModuleVocoder, CausalVocoder)
    if not (
        isinstance(ref_flow, ModuleFlow)
        and isinstance(low_flow, ModuleFlow)
        and isinstance(ref_vocoder, vocoders)
        and isinstance(low_vocoder, vocoders)
    ):
        raise TypeError("the precision check compares the torch flow and vocoder stages")
    mel_ref = ref_flow.mel(speech, voice)
    mel_low = low_flow.mel(speech, voice)

    def wav(engine: SynthesisPipeline, mel: np.ndarray) -> np.ndarray:
        return engine.vocoder.waveform(mel, torch.Generator().manual_seed(seed))

    wav_ref = wav(reference, mel_ref)
    return PrecisionReport(
        dtype=dtype,
        llm_logp_db=snr_db(
            first_step_logp(reference, ids, voice, prompt_text),
            first_step_logp(low, ids, voice, prompt_text),
        ),
        flow_mel_db=snr_db(mel_ref, mel_low),
        hift_wav_db=snr_db(wav_ref, wav(low, mel_ref)),
        hift_decoder_db=(
            _decoder_snr(ref_vocoder, low_vocoder, mel_ref)
            if isinstance(ref_vocoder, ModuleVocoder) and isinstance(low_vocoder, ModuleVocoder)
            else None
        ),
        chain_wav_db=snr_db(wav_ref, wav(low, mel_low)),
    )
