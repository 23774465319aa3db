"""The engine on a CosyVoice 3 directory: what the LLM receives per mode, checked against the
official layout (`llm_reference.npz`'s first-step log-probs), the real strings' ids on the tiny
CosyVoice 3, and streaming with CosyVoice 3's chunk schedule, per request."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from shared.errors import InvalidRequestError
from shared.jobs import Mode
from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.modes import SYSTEM_PROMPT, LLMPrompt, with_text_prefix
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.engine.text_frontend import TextPiece
from workers.model.causal_stream import StreamSchedule as CausalSchedule
from workers.model.llm.cosyvoice3 import END_OF_PROMPT
from workers.model.llm.model import Qwen2LM, plan_decode
from workers.tools.reference.cosyvoice3_llm import load_reference_cosyvoice3_llm
from workers.tools.reference.parity import ReferenceSet

NO_SPEECH = np.zeros(0, dtype=np.int32)
TEXT = "Hello there. Numbers like 42 too."


@pytest.fixture(scope="module")
def ref(reference3_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference3_dir)


@pytest.fixture(scope="module")
def llm(ref: ReferenceSet) -> Qwen2LM:
    return load_reference_cosyvoice3_llm(ref)


def first_logp(llm: Qwen2LM, prompt: LLMPrompt, piece: tuple[int, ...]) -> np.ndarray:
    """The first step's log-probs for one piece, built as the engine builds it."""
    [piece_in] = with_text_prefix([TextPiece("piece", piece)], prompt)
    speech = torch.from_numpy(prompt.speech_tokens.astype(np.int64))
    plan = plan_decode(llm, list(piece_in.ids), prompt_text=prompt.text_ids, prompt_speech=speech)
    with torch.inference_mode():
        from workers.model.llm.qwen2 import KVCache  # noqa: PLC0415

        prefix = llm.prefix_embeddings(*plan.inputs)
        cache = KVCache(llm.config.backbone, prefix.shape[1] + 1, device=prefix.device)
        return llm.step_logp(prefix, cache).numpy()


def array(ref: ReferenceSet, name: str) -> np.ndarray:
    return ref.arrays("llm_reference.npz")[name]


def ids(ref: ReferenceSet, name: str) -> list[int]:
    return [int(i) for i in array(ref, name).reshape(-1)]


def test_cross_lingual_layout_matches_the_official_first_step(
    ref: ReferenceSet, llm: Qwen2LM
) -> None:
    xl = ids(ref, "xl_text")  # [instruction ..., 151646, sentence ...]
    cut = xl.index(int(END_OF_PROMPT)) + 1
    prompt = LLMPrompt([], NO_SPEECH, text_prefix=tuple(xl[:cut]))  # what the engine makes
    got = first_logp(llm, prompt, tuple(xl[cut:]))
    want = array(ref, "xl_first_logp").reshape(-1)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_instruct_layout_matches_the_official_first_step(ref: ReferenceSet, llm: Qwen2LM) -> None:
    prompt = LLMPrompt(ids(ref, "instruct_text"), NO_SPEECH)
    got = first_logp(llm, prompt, tuple(ids(ref, "text")))
    want = array(ref, "instruct_first_logp").reshape(-1)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_zero_shot_layout_matches_the_official_first_step(ref: ReferenceSet, llm: Qwen2LM) -> None:
    speech = np.asarray(ids(ref, "prompt_speech_token"), dtype=np.int32)
    prompt = LLMPrompt(ids(ref, "prompt_text"), speech)
    got = first_logp(llm, prompt, tuple(ids(ref, "text")))
    want = array(ref, "infer_step_logp")[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


@pytest.fixture(scope="module")
def engine(tiny3_model_dir: Path) -> SynthesisPipeline:
    options = EngineOptions(flow_steps=2, forced_speech_tokens=40)
    return build_engine(tiny3_model_dir, device="cpu", options=options)


@pytest.fixture(scope="module")
def voice(engine: SynthesisPipeline, tiny3_model_dir: Path) -> VoicePrompt:
    samples, rate = sf.read(tiny3_model_dir / "prompt.wav", dtype="float32")
    return engine.extract_voice(samples, rate, (tiny3_model_dir / "prompt.txt").read_text())


def test_the_family_comes_from_the_directory(engine: SynthesisPipeline) -> None:
    assert engine.family == engine.identity.family == "cosyvoice3"
    assert engine.frontend.tokenizer.token_id(END_OF_PROMPT_TEXT) == END_OF_PROMPT
    assert engine.frontend.tokenizer.size == 151924  # 280 special tokens after Qwen's 151643 + 3


END_OF_PROMPT_TEXT = "<|endofprompt|>"


def test_each_mode_gives_the_llm_cosyvoice3s_layout(
    engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    encode = engine.frontend.tokenizer.encode
    system = encode(SYSTEM_PROMPT + END_OF_PROMPT_TEXT)
    assert system[-1] == END_OF_PROMPT and END_OF_PROMPT not in system[:-1]

    zero = engine.begin(SynthesisInput(text=TEXT, prompt=voice, seed=1))
    assert zero.prompt.text_ids == system + encode(voice.transcript)  # transcript as written
    assert np.array_equal(zero.prompt.speech_tokens, voice.speech_tokens)
    assert "forty" in " ".join(p.text for p in zero.pieces)  # the TTS text is normalised
    assert all(END_OF_PROMPT not in p.ids for p in zero.pieces)

    xl = engine.begin(SynthesisInput(text=TEXT, prompt=voice, mode="cross_lingual", seed=1))
    assert xl.prompt.text_ids == [] and xl.prompt.speech_tokens.size == 0
    [piece] = xl.pieces  # neither split nor normalised
    assert piece.text == TEXT and list(piece.ids) == system + encode(TEXT)

    instruct = SynthesisInput(
        text=TEXT, prompt=voice, mode="instruct2", instruction="Speak slowly.", seed=1
    )
    plan = engine.begin(instruct)
    want = encode(f"{SYSTEM_PROMPT} Speak slowly.{END_OF_PROMPT_TEXT}")
    assert plan.prompt.text_ids == want and plan.prompt.speech_tokens.size == 0
    spelled = SynthesisInput(
        text=TEXT,
        prompt=voice,
        mode="instruct2",
        instruction=f"{SYSTEM_PROMPT} Speak slowly.{END_OF_PROMPT_TEXT}",
        seed=1,
    )
    assert engine.begin(spelled).prompt.text_ids == want  # not doubled


def test_user_text_may_carry_pronunciation_tokens_never_prompt_tokens(
    engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    plan = engine.begin(SynthesisInput(text="Say [AA1] and [j][ǐ].", prompt=voice, seed=1))
    tokenizer = engine.frontend.tokenizer
    assert {tokenizer.token_id("[AA1]"), tokenizer.token_id("[ǐ]")} <= set(plan.pieces[0].ids)
    for text in ("Say <|endofprompt|> this.", "Say <|endofsystem|> this."):
        with pytest.raises(InvalidRequestError, match="special token"):
            engine.begin(SynthesisInput(text=text, prompt=voice, mode="cross_lingual"))


@pytest.mark.parametrize("mode", ["zero_shot", "cross_lingual", "instruct2"])
def test_every_mode_synthesizes(engine: SynthesisPipeline, voice: VoicePrompt, mode: Mode) -> None:
    instruction = "Speak slowly." if mode == "instruct2" else None
    request = SynthesisInput(text="Hello.", prompt=voice, mode=mode, instruction=instruction)
    out = engine.synthesize(request)
    assert out.speech_tokens == 40 and out.samples.shape == (40 * 2 * 480,)
    assert np.isfinite(out.samples).all() and np.abs(out.samples).max() > 0


def test_streaming_follows_cosyvoice3s_schedule_per_request(
    engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    tokens = 120
    request = SynthesisInput(text="Hello.", prompt=voice, seed=3)
    runs = []
    for _ in range(2):  # upstream keeps the grown hop on the model: here the 2nd starts afresh
        chunks: list[np.ndarray] = []
        samples, _, sizes = engine.run_streaming(request, chunks.append, forced_length=tokens)
        runs.append((samples, sizes))
    (first, sizes), (second, sizes_again) = runs
    assert sizes == sizes_again and np.array_equal(first, second)
    prompt_tokens = int(voice.speech_tokens.size)
    schedule = CausalSchedule()
    hop = schedule.first_hop(prompt_tokens)  # 25 + (ceil(P/25)*25 - P)
    # chunk 1: `hop` tokens' frames, less HiFT's 8 frames of look-ahead (finalize False)
    assert sizes[0] == 480 * (2 * hop - 8)
    assert sizes[1] == 480 * 2 * 50  # then 50 tokens (the 8 held frames move along)
    assert sum(sizes) == first.size == 480 * 2 * tokens  # all of it, as without streaming
    alone = engine.run(request, forced_length=tokens)[0]
    assert alone.shape == first.shape  # the last call's full attention makes them differ
