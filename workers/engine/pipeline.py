"""The synthesis engine: text in, 24 kHz samples out, for every mode, deterministic when seeded.

`build_engine` loads one from plain values (the service layer maps Settings onto them and picks
the backend); `extract_voice` refuses a transcript the modes could not use. One request runs as:
  frontend  normalise + split the text into pieces, token ids of the mode's LLM prompt
  per piece LLM speech tokens -> flow mel (speed change) -> HiFT samples
  join      the pieces' audio with short fades and a pause (`assembly`)
Everything a request owns lives in its `RequestState` (generator, clock, counters), created
per call: the engine object holds only loaded models and options, so requests can run back to
back without leaking into each other. One CPU `torch.Generator` per request, seeded from the
request's seed (a fresh random seed when it has none), feeds the LLM sampler and the HiFT
source in a fixed order, so the same request and seed give the same samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from shared.errors import InvalidRequestError
from workers.engine import family_stages, modes
from workers.engine.api import (
    ChunkSink,
    ModelIdentity,
    SynthesisInput,
    SynthesisOutput,
    VoicePrompt,
    stop_if_asked,
)
from workers.engine.assembly import JoinConfig, change_speed, join_pieces, piece_spans
from workers.engine.batch_session import PipelineBatchSession
from workers.engine.batching import BatchSession, one_at_a_time
from workers.engine.causal_stages import CausalPieceStream
from workers.engine.devices import resolve_device, resolve_dtype
from workers.engine.modes import MAX_PROMPT_TEXT_TOKENS, raw_text, with_text_prefix
from workers.engine.prompt_models import PromptModels
from workers.engine.requests import RequestPlan, RequestState
from workers.engine.speech_bound import check_speech_bound
from workers.engine.stages import FlowStage, ModuleFlow, SpeechTokenStage, VocoderStage
from workers.engine.stream_join import StreamJoiner
from workers.engine.streaming import PieceStream, StreamSchedule
from workers.engine.text_frontend import TextFrontend, TextPiece
from workers.engine.text_split import SplitConfig
from workers.engine.voice_extraction import VoiceExtractor
from workers.model.causal_hift.config import CausalHiFTConfig
from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.directory import FAMILY_SPEECH_TOKENIZER, QWEN_DIR, ModelDirectory
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.heap import HeapPolicy, building_model
from workers.model.llm.decoder_choice import DecodeChoice, open_row_decoder
from workers.model.llm.model import DecodeOutcome
from workers.model.loader import load_model
from workers.model.prompt_features import MAX_TOKENIZER_SECONDS

WARM_UP_TEXT = "Hello."
WARM_UP_TOKENS = 25  # one second of speech: every stage runs once at a bounded cost
WARM_UP_PROMPT_TOKENS = 25
SILENT_MEL = -11.5  # ~ln(1e-5): the prompt mel's floor, i.e. silence


@dataclass(frozen=True)
class EngineOptions:
    """Per-engine choices (the service layer fills them from Settings)."""

    normalize_text: bool = True
    split: SplitConfig = field(default_factory=SplitConfig)
    join: JoinConfig = field(default_factory=JoinConfig)
    max_prompt_seconds: float = MAX_TOKENIZER_SECONDS
    max_prompt_text_tokens: int = MAX_PROMPT_TEXT_TOKENS  # instruction or transcript (`modes`)
    max_speech_seconds: float = math.inf  # refused before any synthesis when estimated above
    forced_speech_tokens: int | None = None  # benchmarks: exactly this many tokens per piece
    flow_steps: int | None = None  # benchmarks and tests: Euler steps instead of the model's 10
    max_batch: int = 16  # the most requests one batch session may hold (KV cache rows)
    batch_max_positions: int = 2048  # KV positions per batch row; longer pieces run alone
    join_reduced_precision_flow: bool = False  # bf16/fp16: one flow call per batch, not per piece
    stream: StreamSchedule = field(default_factory=StreamSchedule)  # streamed requests' hops
    heap: HeapPolicy = field(default_factory=HeapPolicy)  # glibc: freed memory kept for reuse
    decode: DecodeChoice = field(default_factory=DecodeChoice)  # CUDA: graphs, compiled step
    llm_precision: str = "native"  # "int8": the LLM step in ONNX Runtime (`llm_precision.py`)
    ort_cache_dir: Path | None = None  # int8's built graphs (None: ~/.cache/cosyq/onnx)

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.batch_max_positions < 1:
            raise ValueError("max_batch and batch_max_positions must be >= 1")
        if self.flow_steps is not None and self.flow_steps < 1:
            raise ValueError("flow_steps must be >= 1")


class SynthesisPipeline:
    """A `SynthesisEngine`: front end, three stages and how to assemble their output."""

    def __init__(
        self,
        *,
        frontend: TextFrontend,
        voices: VoiceExtractor,
        llm: SpeechTokenStage,
        flow: FlowStage,
        vocoder: VocoderStage,
        identity: ModelIdentity,
        sample_rate: int,
        options: EngineOptions,
        prompt_dims: tuple[int, int] = (80, 192),  # mel bins, speaker embedding size
        family: str = "cosyvoice2",  # the model directory's: cosyvoice2 or cosyvoice3
    ) -> None:
        self.frontend, self.voices = frontend, voices
        self.llm, self.flow, self.vocoder = llm, flow, vocoder
        self.identity = identity
        self.sample_rate = sample_rate
        self.options = options
        self.prompt_dims = prompt_dims
        self.family = family

    def synthesize(self, request: SynthesisInput) -> SynthesisOutput:
        samples, state = self.run(request)
        return engine_output(samples, self.sample_rate, state)

    def run(
        self, request: SynthesisInput, *, forced_length: int | None = None
    ) -> tuple[np.ndarray, RequestState]:
        """Samples and the request's state (stage times, counters: what `bench` reports)."""
        plan = self.begin(request)
        forced = forced_length if forced_length is not None else self.options.forced_speech_tokens
        audio = [self._piece(piece, plan, forced) for piece in plan.pieces]
        return self.finish(audio, plan), plan.state

    def synthesize_planned(self, plan: RequestPlan) -> SynthesisOutput:
        """A request already through `begin`, alone: its pieces and join (the batch session
        runs these beside its batch, the front end having run on its own thread)."""
        forced = self.options.forced_speech_tokens
        audio = [self._piece(piece, plan, forced) for piece in plan.pieces]
        return engine_output(self.finish(audio, plan), self.sample_rate, plan.state)

    def synthesize_streaming(self, request: SynthesisInput, on_chunk: ChunkSink) -> SynthesisOutput:
        samples, state, chunks = self.run_streaming(request, on_chunk)
        output = engine_output(samples, self.sample_rate, state)
        output.chunk_samples = chunks
        return output

    def run_streaming(
        self,
        request: SynthesisInput,
        on_chunk: ChunkSink,
        *,
        forced_length: int | None = None,
        state: RequestState | None = None,
    ) -> tuple[np.ndarray, RequestState, list[int]]:
        """The streaming path, beside the batched one (it shares the LLM loop and the flow):
        each piece's chunks go to `on_chunk`, joined as `finish` joins whole pieces, as soon
        as they exist. Returns the samples (the chunks concatenated), the request's state
        (`state` when given: a bench reads its clock per chunk) and each chunk's length."""
        if request.speed != 1.0:
            raise InvalidRequestError(f"speed: streaming needs speed 1.0 (got {request.speed:g})")
        plan = self.begin(request)
        if state is not None:
            state.clock.seconds["frontend"] += plan.state.clock.seconds["frontend"]
            plan.state = state
        forced = forced_length if forced_length is not None else self.options.forced_speech_tokens
        chunks: list[int] = []

        def emit(samples: np.ndarray) -> None:
            chunks.append(int(samples.size))
            on_chunk(samples)

        pieces = plan.pieces
        joiner = StreamJoiner(
            len(pieces),
            self.sample_rate,
            self.options.join,
            emit,
            gaps=[piece.pause_before_s for piece in pieces[1:]],
            lead_s=pieces[0].pause_before_s or 0.0,
            tail_s=pieces[-1].pause_after_s,
        )
        for piece in pieces:
            joiner.start_piece()
            for audio in self._stream_piece(piece, plan, forced):
                joiner.feed(audio)
            joiner.end_piece()
        with plan.state.clock.timed("join"):
            samples = joiner.finish()
        self.place_pieces(joiner.lengths, plan)
        return samples, plan.state, chunks

    def _stream_piece(
        self, piece: TextPiece, plan: RequestPlan, forced_length: int | None
    ) -> Iterator[np.ndarray]:
        """One piece's chunks; a stage that cannot stream (Core ML) gives the whole piece."""
        stream = self._piece_stream(plan)
        if stream is None:
            yield self._piece(piece, plan, forced_length)
            return
        state = plan.state
        kwargs: dict[str, Any] = {
            "prompt_text": plan.prompt.text_ids,
            "prompt_speech": plan.prompt.speech_tokens,
            "generator": state.generator,
            "forced_length": forced_length,
            "should_stop": plan.request.should_stop,
        }
        token_stream = getattr(self.llm, "stream", None)
        outcome = DecodeOutcome()
        if token_stream is None:  # an LLM runtime without a token stream: all tokens at once
            with state.clock.timed("llm"):
                made = self.llm.generate(list(piece.ids), **kwargs)
            outcome.stop, tokens = made.stop, iter(made.ids)
        else:
            tokens = token_stream(list(piece.ids), **kwargs, outcome=outcome)
        state.pieces += 1
        ids: list[int] = []
        while True:
            with state.clock.timed("llm"):
                token = next(tokens, None)
            if token is None:
                break
            state.speech_tokens += 1
            ids.append(int(token))
            chunk = stream.push(int(token))
            if chunk is not None:
                yield chunk
        state.record_stop(ids, outcome.stop)
        yield stream.finish()

    def _piece_stream(self, plan: RequestPlan) -> PieceStream | CausalPieceStream | None:
        """One piece's stream for this family's stages; None when one cannot (Core ML's)."""
        flow, vocoder, state = self.flow, self.vocoder, plan.state
        model, hift = getattr(flow, "model", None), getattr(vocoder, "model", None)
        if isinstance(model, CausalMaskedDiffWithDiT) and isinstance(hift, CausalHiFTGenerator):
            return CausalPieceStream(
                model,
                hift,
                plan.request.prompt,
                schedule=self.options.stream,
                timed=state.clock.timed,
            )
        if not (getattr(flow, "can_stream", False) and getattr(vocoder, "can_stream", False)):
            return None
        return PieceStream(
            flow,  # type: ignore[arg-type]  # can_stream: a ModuleFlow on our torch flow
            vocoder,  # type: ignore[arg-type]
            plan.request.prompt,
            state.generator,
            schedule=self.options.stream,
            timed=state.clock.timed,
        )

    def begin(self, request: SynthesisInput) -> RequestPlan:
        """The front end of one request: checks, pieces, the mode's LLM prompt, its state."""
        state = RequestState.start(request.seed)
        with state.clock.timed("frontend"):
            pieces = self.text_pieces(request)
            limit = self.options.max_prompt_text_tokens
            prompt = modes.llm_prompt(self.frontend, request, self.family, limit)
            pieces = with_text_prefix(pieces, prompt)
        state.text_tokens = sum(len(piece.ids) for piece in pieces)
        return RequestPlan(request, state, pieces, prompt)

    def text_pieces(self, request: SynthesisInput) -> list[TextPiece]:
        """The request checked and split into pieces, before any synthesis: what the worker
        accepts (InvalidRequestError naming the rule otherwise)."""
        _check_request(request)
        pieces = self.frontend.pieces(
            request.text,
            language=request.language,
            transcript=request.prompt.transcript,
            raw=raw_text(self.family, request.mode),
        )
        check_speech_bound(
            pieces,
            self.options.max_speech_seconds,
            self.frontend.count_tokens,
            per_piece=request.split_past_limit,
        )
        return pieces

    def _piece(self, piece: TextPiece, plan: RequestPlan, forced_length: int | None) -> np.ndarray:
        state = plan.state
        stop_if_asked(plan.request.should_stop)
        with state.clock.timed("llm"):
            tokens = self.llm.generate(
                list(piece.ids),
                prompt_text=plan.prompt.text_ids,
                prompt_speech=plan.prompt.speech_tokens,
                generator=state.generator,
                forced_length=forced_length,
                should_stop=plan.request.should_stop,
            )
        state.llm_first_token_s += tokens.first_token_s
        state.record_stop(tokens.ids, tokens.stop)
        return self.piece_audio(tokens.ids, plan)

    def piece_audio(
        self, ids: np.ndarray, plan: RequestPlan, mel: np.ndarray | None = None
    ) -> np.ndarray:
        """One piece's speech tokens -> its samples (flow, speed change, HiFT); `mel` is the
        flow's output when a batched flow call already made it."""
        speech = self.piece_mel(ids, plan, mel)
        if speech is None:
            return np.zeros(0, dtype=np.float32)
        with plan.state.clock.timed("hift"):
            return self.vocoder.waveform(speech, plan.state.generator)

    def piece_mel(
        self, ids: np.ndarray, plan: RequestPlan, mel: np.ndarray | None = None
    ) -> np.ndarray | None:
        """The piece counted, and its mel after the speed change (the vocoder's input); None
        for a piece without speech tokens (no audio). `mel`: the flow's output, when made."""
        state = plan.state
        state.pieces += 1
        state.speech_tokens += int(ids.size)
        if ids.size == 0:
            return None
        with state.clock.timed("flow"):
            if mel is None:
                mel = self.flow.mel(ids, plan.request.prompt)
            return change_speed(mel, plan.request.speed)

    def finish(self, audio: list[np.ndarray], plan: RequestPlan) -> np.ndarray:
        """The pieces' samples joined into the request's utterance (with the text's pauses)."""
        pieces = plan.pieces
        self.place_pieces([a.shape[0] for a in audio], plan)
        with plan.state.clock.timed("join"):
            return join_pieces(
                audio,
                self.sample_rate,
                self.options.join,
                gaps=[piece.pause_before_s for piece in pieces[1:]],
                lead_s=pieces[0].pause_before_s or 0.0,
                tail_s=pieces[-1].pause_after_s,
            )

    def place_pieces(self, lengths: list[int], plan: RequestPlan) -> None:
        """Each piece's text and where its samples lie in the joined utterance, set on the
        request's spans beside how each piece's decoding ended."""
        pieces = plan.pieces
        bounds = piece_spans(
            lengths,
            self.sample_rate,
            self.options.join,
            gaps=[piece.pause_before_s for piece in pieces[1:]],
            lead_s=pieces[0].pause_before_s or 0.0,
        )
        plan.state.place_pieces([piece.text for piece in pieces], bounds)

    @property
    def forced_speech_tokens(self) -> int | None:
        return self.options.forced_speech_tokens

    def open_batch_session(self, max_batch: int) -> BatchSession:
        """Continuous batching when the LLM has a batched decoder (our torch Qwen2LM, the int8
        ONNX Runtime step), else one request at a time (a Core ML LLM's batch-1 state)."""
        if max_batch > self.options.max_batch:
            raise ValueError(
                f"a batch of {max_batch} exceeds the engine's max_batch {self.options.max_batch}"
            )
        model = getattr(self.llm, "model", None)
        positions = self.options.batch_max_positions
        decoder = None
        if max_batch > 1:
            decoder = open_row_decoder(model, max_batch, positions, choice=self.options.decode)
        if decoder is None:
            return one_at_a_time(self, max_batch, llm=type(model).__name__)
        return PipelineBatchSession(self, decoder, max_batch)

    def extract_voice(self, samples: np.ndarray, sample_rate: int, transcript: str) -> VoicePrompt:
        limit = self.options.max_prompt_text_tokens  # refused before the work
        modes.check_voice_transcript(self.frontend, transcript, self.family, limit)
        return self.voices.extract(samples, sample_rate, transcript)

    def warm_up(self) -> None:
        """One short synthesis (forced length) on a silent prompt: every stage runs once."""
        mel_bins, embedding_dim = self.prompt_dims
        prompt = VoicePrompt(
            speech_tokens=np.zeros(WARM_UP_PROMPT_TOKENS, dtype=np.int32),
            mel=np.full((2 * WARM_UP_PROMPT_TOKENS, mel_bins), SILENT_MEL, dtype=np.float32),
            embedding=np.zeros(embedding_dim, dtype=np.float32),
            transcript="",
        )
        request = SynthesisInput(text=WARM_UP_TEXT, prompt=prompt, mode="cross_lingual", seed=0)
        self.run(request, forced_length=WARM_UP_TOKENS)


def engine_output(samples: np.ndarray, sample_rate: int, state: RequestState) -> SynthesisOutput:
    """The engine's answer for one request: samples plus its books (stages, pieces, seed)."""
    return SynthesisOutput(
        samples=samples,
        sample_rate=sample_rate,
        stage_seconds=dict(state.clock.seconds),
        speech_tokens=state.speech_tokens,
        pieces=list(state.spans),
        text_tokens=state.text_tokens,
        seed=state.seed,
    )


def _check_request(request: SynthesisInput) -> None:
    if not np.isfinite(request.speed) or request.speed <= 0:
        raise InvalidRequestError(f"speed: {request.speed} must be a positive number")
    if request.seed is not None and not 0 <= request.seed < 2**32:
        raise InvalidRequestError(f"seed: {request.seed} is outside 0-{2**32 - 1:,}")


def build_engine(
    model_dir: Path,
    *,
    device: str = "auto",
    dtype: str = "fp32",
    options: EngineOptions | None = None,
    hash_cache_dir: Path | None = None,
    flow: FlowStage | None = None,
    vocoder: VocoderStage | None = None,
    llm: SpeechTokenStage | None = None,
    backend: str = "torch",
    reported_device: str | None = None,
) -> SynthesisPipeline:
    """Load a model directory into an engine whose torch parts run on `device` ("auto": mps,
    cuda, cpu). Another runtime's `flow` / `vocoder` / `llm` stages replace the torch ones;
    `backend` and `reported_device` then say so in the engine's identity ("coreml", "ane/cpu").
    """
    options = options or EngineOptions()
    torch_device = resolve_device(device)
    replaced = {"flow": flow, "hift": vocoder}
    family = ModelDirectory(Path(model_dir)).family  # from the directory's yaml, never a setting
    with building_model(options.heap):  # process-wide; the request policy from its end on
        loaded = load_model(
            model_dir,
            device=torch_device,
            dtype=resolve_dtype(dtype),
            hash_cache_dir=hash_cache_dir,
            torch_stages=frozenset(stage for stage, other in replaced.items() if other is None),
            flow_steps=options.flow_steps,
        )
    configs = loaded.configs
    frontend = TextFrontend(
        family_stages.family_tokenizer(loaded.directory.root / QWEN_DIR, family),
        normalize=options.normalize_text,
        split=options.split,
    )
    prompt_models = PromptModels(
        loaded.directory.root,
        threads=torch.get_num_threads(),
        speech_tokenizer=FAMILY_SPEECH_TOKENIZER[family],
    )
    voices = VoiceExtractor(
        prompt_models,
        configs.mel,
        speech_vocab=configs.llm.speech_token_size,
        max_seconds=options.max_prompt_seconds,
    )
    identity = ModelIdentity(
        name=loaded.directory.name,
        checkpoint_hash=loaded.checkpoint_hash,
        backend=backend,
        device=reported_device or str(torch_device),
        family=family,
    )
    hift_config = configs.hift.base if isinstance(configs.hift, CausalHiFTConfig) else configs.hift
    return SynthesisPipeline(
        frontend=frontend,
        voices=voices,
        llm=llm or family_stages.llm_stage(loaded, options.llm_precision, options.ort_cache_dir),
        flow=flow
        or ModuleFlow(
            loaded.flow,
            voice_prefixes=family_stages.voice_prefixes(options.stream),
            join_reduced_precision=options.join_reduced_precision_flow,
        ),
        vocoder=vocoder or family_stages.vocoder_stage(loaded),
        identity=identity,
        sample_rate=hift_config.sampling_rate,
        options=options,
        prompt_dims=(configs.flow.mel_bins, configs.flow.spk_embed_dim),
        family=family,
    )
