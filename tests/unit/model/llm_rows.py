"""What the batched-decoder tests share (torch `BatchDecoder` and int8 `OrtBatchDecoder`): a
small random Qwen2 LLM whose EOS is likely enough that unforced rows end at different steps,
six pieces of other lengths, prompts, seeds and forced counts, each piece decoded alone, and a
driver that adds pieces between steps as rows come free."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.model.llm.batch import FinishedRow, RowBatch
from workers.model.llm.model import LLMConfig, Qwen2LM, SpeechLM, iter_speech_tokens
from workers.model.llm.qwen2 import Qwen2Config
from workers.model.llm.sampling import SamplingConfig
from workers.tools.fixtures.random_weights import build_random_llm

SPEECH = 40


def random_llm(*, hidden: int, intermediate: int, seed: int = 5) -> Qwen2LM:
    qwen = {
        "hidden_size": hidden,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": intermediate,
        "vocab_size": 100,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
    }
    config = LLMConfig(
        backbone=Qwen2Config.from_hf_config(qwen, source="test"),
        speech_token_size=SPEECH,
        sampling=SamplingConfig(),
    )
    model: Qwen2LM = build_random_llm(config, seed=seed)
    with torch.no_grad():  # EOS likely enough that unforced rows end at different steps
        model.llm_decoder.bias[SPEECH] = 0.0
        model.llm_decoder.bias[SPEECH + 1 :] = -4.0
    return model


@dataclass(frozen=True)
class Piece:
    text: list[int]
    prompt_text: list[int]
    prompt_speech: list[int]
    seed: int
    forced: int | None = None


PIECES = [
    Piece([5, 6, 7], [1, 2], [3, 4, 5, 6], seed=1),
    Piece([9] * 11, [], [], seed=2),
    Piece([11, 12], [40, 41, 42, 43, 44], [7] * 20, seed=3),
    Piece([13, 14, 15, 16, 17, 18], [8], [], seed=4, forced=17),
    Piece([20], [], [1, 2, 3], seed=5),
    Piece([30, 31, 32, 33], [50, 51], [9, 10], seed=6, forced=0),
]


def request(piece: Piece) -> dict[str, object]:
    """The keywords a piece gives both `iter_speech_tokens` and `RowBatch.add` (a fresh
    generator at the piece's seed each time)."""
    return {
        "prompt_text": piece.prompt_text,
        "prompt_speech": piece.prompt_speech,
        "generator": torch.Generator().manual_seed(piece.seed),
        "forced_length": piece.forced,
    }


def alone(model: SpeechLM, piece: Piece) -> list[int]:
    return list(iter_speech_tokens(model, piece.text, **request(piece)))  # type: ignore[arg-type]


def add(decoder: RowBatch, key: int, piece: Piece) -> None:
    decoder.add(key, piece.text, **request(piece))  # type: ignore[arg-type]


def drain(decoder: RowBatch, joins: list[tuple[int, int]]) -> dict[int, FinishedRow]:
    """Step until every piece finished; `joins` are (earliest step, PIECES index) in order,
    each added at the first step boundary from then on with a free row."""
    done: dict[int, FinishedRow] = {}
    pending = list(joins)
    step = 0
    while decoder.rows or pending:
        while pending and pending[0][0] <= step and decoder.free:
            add(decoder, pending[0][1], PIECES[pending[0][1]])
            pending.pop(0)
        done.update({int(row.key): row for row in decoder.step()})  # type: ignore[call-overload]
        step += 1
    return done
