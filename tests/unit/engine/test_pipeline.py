"""The engine on the tiny model: every mode, determinism, speed, long text, errors, isolation."""

from __future__ import annotations

import dataclasses
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile

from shared.errors import EmptyTextError, InvalidRequestError, ModelLoadError
from shared.settings import Settings
from workers.engine.api import SynthesisEngine, SynthesisInput, VoicePrompt
from workers.engine.pipeline import (
    WARM_UP_TOKENS,
    EngineOptions,
    SynthesisPipeline,
    build_engine,
)
from workers.engine.text_split import SplitConfig
from workers.service.default_engine import engine_from_settings

TEXT = "Hello, a short test."
SAMPLES_PER_TOKEN = 960  # 2 mel frames x 480 samples
# The flow in 2 Euler steps, not the model's 10 (the same step's arithmetic repeated): what
# these tests compare (modes, seeds, speeds, isolation, pieces, lengths) does not depend on the
# count, and the flow was half of each synthesis's CPU.
FLOW_STEPS = 2


@pytest.fixture(scope="module")
def tiny_engine(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> SynthesisPipeline:
    """The real torch engine on the tiny model (cpu, fp32), its flow in FLOW_STEPS steps."""
    return build_engine(
        tiny_model_dir,
        device="cpu",
        options=EngineOptions(flow_steps=FLOW_STEPS),
        hash_cache_dir=tmp_path_factory.mktemp("hashes"),
    )


@pytest.fixture(scope="module")
def voice(tiny_engine: SynthesisPipeline, tiny_model_dir: Path) -> VoicePrompt:
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    transcript = (tiny_model_dir / "prompt.txt").read_text().strip()
    return tiny_engine.extract_voice(samples, int(rate), transcript)


def request(voice: VoicePrompt, **changes: object) -> SynthesisInput:
    base = SynthesisInput(text=TEXT, prompt=voice, seed=7)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_engine_satisfies_the_protocol(tiny_engine: SynthesisPipeline) -> None:
    engine: SynthesisEngine = tiny_engine
    assert engine.sample_rate == 24000
    identity = engine.identity
    assert identity.backend == "torch" and identity.device == "cpu"
    assert len(identity.checkpoint_hash) == 16 and identity.name.startswith("tiny-model")


@pytest.mark.parametrize(
    ("mode", "instruction"),
    [("zero_shot", None), ("cross_lingual", None), ("instruct2", "Speak slowly and calmly.")],
)
def test_every_mode_synthesizes(
    tiny_engine: SynthesisPipeline, voice: VoicePrompt, mode: str, instruction: str | None
) -> None:
    out = tiny_engine.synthesize(request(voice, mode=mode, instruction=instruction))
    assert out.sample_rate == 24000 and out.samples.dtype == np.float32
    assert out.samples.ndim == 1 and out.speech_tokens > 0
    assert out.samples.shape[0] == out.speech_tokens * SAMPLES_PER_TOKEN
    assert np.abs(out.samples).max() <= 0.99 and np.isfinite(out.samples).all()
    assert set(out.stage_seconds) == {"frontend", "llm", "flow", "hift", "join"}
    assert all(seconds > 0 for seconds in out.stage_seconds.values())


def test_modes_give_the_llm_different_prompts(
    tiny_engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    outputs = [
        tiny_engine.synthesize(request(voice, mode=mode, instruction=instruction)).samples
        for mode, instruction in (
            ("zero_shot", None),
            ("cross_lingual", None),
            ("instruct2", "Speak slowly."),
        )
    ]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.array_equal(outputs[i], outputs[j])


def test_same_seed_same_samples_different_seed_different(
    tiny_engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    first = tiny_engine.synthesize(request(voice, seed=123)).samples
    again = tiny_engine.synthesize(request(voice, seed=123)).samples
    other = tiny_engine.synthesize(request(voice, seed=124)).samples
    assert np.array_equal(first, again)
    assert first.shape != other.shape or not np.allclose(first, other, atol=1e-3)


def test_no_seed_draws_a_fresh_one(tiny_engine: SynthesisPipeline, voice: VoicePrompt) -> None:
    runs = [tiny_engine.run(request(voice, seed=None))[1].seed for _ in range(3)]
    assert len(set(runs)) == 3 and all(0 <= s < 2**32 for s in runs)


def test_requests_do_not_leak_into_each_other(
    tiny_engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    """Back to back (with other work in between) each request gives what it gives alone."""
    a, b = request(voice, seed=1), request(voice, text="Another sentence entirely.", seed=2)
    alone_a = tiny_engine.synthesize(a).samples
    alone_b = tiny_engine.synthesize(b).samples
    tiny_engine.synthesize(request(voice, mode="cross_lingual", speed=1.5, seed=None))
    assert np.array_equal(tiny_engine.synthesize(b).samples, alone_b)
    assert np.array_equal(tiny_engine.synthesize(a).samples, alone_a)


def test_speed_changes_duration(tiny_engine: SynthesisPipeline, voice: VoicePrompt) -> None:
    runs = {speed: tiny_engine.synthesize(request(voice, speed=speed)) for speed in (1.0, 2.0, 0.5)}
    tokens = runs[1.0].speech_tokens
    assert all(out.speech_tokens == tokens for out in runs.values())  # same LLM draws
    frames = 2 * tokens
    assert runs[2.0].samples.shape[0] == round(frames / 2.0) * 480
    assert runs[0.5].samples.shape[0] == round(frames / 0.5) * 480


def test_long_text_is_split_and_joined(
    tiny_engine: SynthesisPipeline, tiny_model_dir: Path, voice: VoicePrompt
) -> None:
    text = "The first sentence is here. A second one follows it. And then a third."
    sentences = ("The first sentence is here.", "A second one follows it.", "And then a third.")
    counts = [len(tiny_engine.frontend.tokenizer.encode(s + " ")) for s in sentences]
    budget = max(counts)  # one sentence per piece: any two together are over it
    assert all(a + b > budget for a, b in itertools.pairwise(counts))
    split = SplitConfig(max_piece_tokens=budget, min_tail_tokens=0)
    options = EngineOptions(split=split, flow_steps=FLOW_STEPS)
    engine = build_engine(tiny_model_dir, device="cpu", options=options)
    samples, state = engine.run(request(voice, text=text))
    assert state.pieces == 3
    gap = int(options.join.gap_s * engine.sample_rate)
    assert samples.shape[0] == state.speech_tokens * SAMPLES_PER_TOKEN + 2 * gap
    assert [p.text for p in engine.frontend.pieces(text)] == list(sentences)
    first, _ = engine.run(request(voice, text=sentences[0]))
    n = first.shape[0]
    assert np.array_equal(samples[n : n + gap], np.zeros(gap, dtype=np.float32))
    fade = int(options.join.fade_s * engine.sample_rate)
    # same seed, same first piece: identical up to the fade-out at its end
    assert np.array_equal(samples[: n - fade], first[: n - fade])
    assert np.abs(samples[n - 1]) <= np.abs(first[n - 1])


def test_warm_up_runs_every_stage(tiny_engine: SynthesisPipeline) -> None:
    tiny_engine.warm_up()
    prompt = VoicePrompt(
        np.zeros(4, dtype=np.int32), np.zeros((8, 80), np.float32), np.zeros(192, np.float32), ""
    )
    samples, state = tiny_engine.run(
        SynthesisInput(text="Hi.", prompt=prompt, mode="cross_lingual"),
        forced_length=WARM_UP_TOKENS,
    )
    assert state.speech_tokens == WARM_UP_TOKENS
    assert samples.shape[0] == WARM_UP_TOKENS * SAMPLES_PER_TOKEN


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"text": " ... "}, EmptyTextError, "text: nothing to speak"),
        ({"mode": "instruct2"}, InvalidRequestError, "instruction: required by mode instruct2"),
        ({"instruction": "Loud."}, InvalidRequestError, "only used by mode instruct2"),
        ({"mode": "karaoke"}, InvalidRequestError, "mode: 'karaoke' is not"),
        ({"speed": 0.0}, InvalidRequestError, "speed: 0.0 must be a positive number"),
        ({"seed": -1}, InvalidRequestError, "seed: -1 is outside"),
    ],
)
def test_invalid_requests(
    tiny_engine: SynthesisPipeline,
    voice: VoicePrompt,
    changes: dict[str, object],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        tiny_engine.synthesize(request(voice, **changes))


def test_zero_shot_needs_a_transcript(tiny_engine: SynthesisPipeline, voice: VoicePrompt) -> None:
    untranscribed = dataclasses.replace(voice, transcript="")
    with pytest.raises(InvalidRequestError, match="the voice has no transcript"):
        tiny_engine.synthesize(request(untranscribed))
    assert tiny_engine.synthesize(request(untranscribed, mode="cross_lingual")).speech_tokens


def test_a_prompt_text_every_piece_repeats_is_bounded_in_tokens(
    tiny_engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    """The speech bound counts the TTS text only: a 2,000-character instruction (or voice
    transcript) went into every piece's LLM input, thousands of positions each, for a job
    estimated at a few seconds of speech. Refused before any synthesis, naming the field."""
    long = "Speak slowly and calmly. " * 80  # the gate's 2,000 characters; ~1,400 tiny tokens
    with pytest.raises(InvalidRequestError, match=r"instruction: 1,\d{3} tokens, limit 512"):
        tiny_engine.synthesize(request(voice, mode="instruct2", instruction=long))
    transcribed = dataclasses.replace(voice, transcript=long)
    with pytest.raises(InvalidRequestError, match=r"prompt_text: 1,\d{3} tokens, limit 512"):
        tiny_engine.synthesize(request(transcribed))
    assert tiny_engine.synthesize(request(voice, mode="instruct2", instruction=long[:400]))


def test_a_voice_whose_transcript_no_job_could_use_is_refused_when_added(
    tiny_engine: SynthesisPipeline, tiny_model_dir: Path
) -> None:
    """A voice added with a transcript over the prompt text's bound in tokens would fail every
    zero_shot job naming it: refused when it is added, naming the transcript."""
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    long = "Speak slowly and calmly. " * 80
    with pytest.raises(InvalidRequestError, match=r"transcript: 1,\d{3} tokens, limit 512"):
        tiny_engine.extract_voice(samples, int(rate), long)
    assert tiny_engine.extract_voice(samples, int(rate), long[:400]).transcript.strip()


def test_normalisation_setting_reaches_the_text(tiny_model_dir: Path) -> None:
    plain = build_engine(tiny_model_dir, device="cpu", options=EngineOptions(normalize_text=False))
    assert plain.frontend.pieces("It is 42")[0].text == "It is 42"


def test_load_engine_from_settings(tiny_model_dir: Path, tmp_path: Path) -> None:
    settings = Settings(
        _env_file=None,
        model_dir=tiny_model_dir,
        device="cpu",
        max_piece_tokens=33,
        piece_gap_ms=250,
        normalize_text=False,
        hash_cache_dir=tmp_path / "hashes",
    )
    engine = engine_from_settings(settings)
    assert engine.frontend.split.max_piece_tokens == 33
    assert engine.options.join.gap_s == 0.25 and not engine.frontend.normalizer.enabled
    assert list((tmp_path / "hashes").iterdir())  # checkpoint hashes cached for the next worker
    with pytest.raises(ModelLoadError, match="COSYQ_MODEL_DIR is not set"):
        engine_from_settings(Settings(_env_file=None))
    if sys.platform != "darwin":  # on a Mac the same call needs a conversion instead
        with pytest.raises(ModelLoadError, match=r"^Core ML runs only on macOS; use COSYQ_BACKEND"):
            engine_from_settings(settings.model_copy(update={"backend": "coreml"}))


class _Shell:
    """Exposes only `inference` (and `config`), like the Core ML stand-ins: no parameters()."""

    def __init__(self, module: object) -> None:
        self._module = module
        self.config = module.config  # type: ignore[attr-defined]

    def inference(self, *args: object, **kwargs: object) -> object:
        return self._module.inference(*args, **kwargs)  # type: ignore[attr-defined]


def test_another_runtime_plugs_in_as_stage_objects(
    tiny_engine: SynthesisPipeline, tiny_model_dir: Path, voice: VoicePrompt
) -> None:
    from workers.engine.stages import ModuleFlow, ModuleVocoder  # noqa: PLC0415

    flow = ModuleFlow(_Shell(tiny_engine.flow.model), name="stand-in")  # type: ignore[attr-defined]
    vocoder = ModuleVocoder(_Shell(tiny_engine.vocoder.model), name="stand-in")  # type: ignore[attr-defined]
    engine = build_engine(
        tiny_model_dir,
        device="cpu",
        flow=flow,
        vocoder=vocoder,
        backend="coreml",
        reported_device="ane/gpu/cpu",
    )
    assert engine.flow is flow and engine.vocoder is vocoder
    assert (engine.identity.backend, engine.identity.device) == ("coreml", "ane/gpu/cpu")
    same = request(voice, seed=11)
    assert np.array_equal(engine.synthesize(same).samples, tiny_engine.synthesize(same).samples)


def test_a_runaway_expansion_is_refused_before_any_synthesis(
    tiny_model_dir: Path, voice: VoicePrompt
) -> None:
    engine = build_engine(
        tiny_model_dir, device="cpu", options=EngineOptions(max_speech_seconds=150)
    )
    calls: list[object] = []
    engine.llm = type("NoLLM", (), {"generate": lambda *a, **k: calls.append(a)})()  # type: ignore[assignment]
    with pytest.raises(InvalidRequestError) as caught:
        engine.synthesize(request(voice, text="9" * 2000))
    message = str(caught.value)
    assert message.startswith("text: about ") and "text tokens after normalisation" in message
    assert "limit 150 s (COSYQ_MAX_SPEECH_SECONDS)" in message
    assert calls == []  # refused in the front end: the LLM never ran


def test_ssml_breaks_are_pauses_in_the_audio(
    tiny_engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    text = '<speak>Hello there.<break time="700ms"/>Goodbye now.</speak>'
    samples, state = tiny_engine.run(request(voice, text=text))
    assert state.pieces == 2
    assert samples.shape[0] == state.speech_tokens * SAMPLES_PER_TOKEN + 700 * 24
