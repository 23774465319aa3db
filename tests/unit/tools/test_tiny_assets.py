"""Tiny-model side files: tokenizer ids, ONNX stand-in signatures, the built-in prompt."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import soundfile

from shared.errors import ModelLoadError
from workers.model.tokenizer import COSYVOICE2_SPECIAL_TOKENS, load_text_tokenizer
from workers.tools.fixtures.tiny_assets import (
    PROMPT_SAMPLE_RATE,
    write_prompt,
    write_speaker_model,
    write_speech_tokenizer,
    write_tokenizer,
)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("blank-en")
    write_tokenizer(folder, text_vocab_size=1024, n_special=len(COSYVOICE2_SPECIAL_TOKENS))
    return folder


def test_special_tokens_follow_the_base_vocabulary_in_cosyvoice_order(tokenizer_dir: Path) -> None:
    tok = load_text_tokenizer(tokenizer_dir)
    eot = tok.token_id("<|endoftext|>")
    assert tok.token_id("<|im_start|>") == eot + 1
    assert tok.token_id("<|im_end|>") == eot + 2
    assert tok.token_id("<|endofprompt|>") == eot + 3
    assert tok.token_id("[mn]") == eot + 3 + len(COSYVOICE2_SPECIAL_TOKENS) - 3
    assert tok.size <= 1024


def test_encoding_keeps_specials_whole_and_round_trips(tokenizer_dir: Path) -> None:
    tok = load_text_tokenizer(tokenizer_dir)
    ids = tok.encode("Say it gently<|endofprompt|>Hello, 世界 [laughter]!")
    assert tok.token_id("<|endofprompt|>") in ids
    assert tok.token_id("[laughter]") in ids
    assert tok.decode(tok.encode("Hello, 世界! 42")) == "Hello, 世界! 42"


def test_tokenizer_ids_are_checked_against_the_config(tokenizer_dir: Path, tmp_path: Path) -> None:
    for name in ("vocab.json", "merges.txt"):
        (tmp_path / name).write_bytes((tokenizer_dir / name).read_bytes())
    text = (tokenizer_dir / "tokenizer_config.json").read_text()
    eot = load_text_tokenizer(tokenizer_dir).token_id("<|endoftext|>")
    (tmp_path / "tokenizer_config.json").write_text(text.replace(f'"{eot}"', f'"{eot + 7}"'))
    with pytest.raises(ModelLoadError, match="should have id"):
        load_text_tokenizer(tmp_path)


def test_missing_tokenizer_file_is_named(tokenizer_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_bytes((tokenizer_dir / "vocab.json").read_bytes())
    with pytest.raises(ModelLoadError, match=r"merges\.txt: file missing"):
        load_text_tokenizer(tmp_path)


def test_speech_tokenizer_standin_has_the_real_signature(tmp_path: Path) -> None:
    path = tmp_path / "speech_tokenizer_v2.onnx"
    write_speech_tokenizer(path, np.random.default_rng(0), speech_vocab=6561)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inputs = session.get_inputs()
    assert [(i.type, len(i.shape)) for i in inputs] == [("tensor(float)", 3), ("tensor(int32)", 1)]
    for frames in (100, 101, 104):
        feats = np.random.default_rng(frames).standard_normal((1, 128, frames)).astype(np.float32)
        (tokens,) = session.run(
            None, {inputs[0].name: feats, inputs[1].name: np.array([frames], np.int32)}
        )
        assert tokens.shape == (1, -(-frames // 4))
        assert tokens.dtype == np.int64
        assert tokens.min() >= 0 and tokens.max() < 6561


def test_speaker_model_standin_returns_192_floats(tmp_path: Path) -> None:
    path = tmp_path / "campplus.onnx"
    write_speaker_model(path, np.random.default_rng(0))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fbank = np.random.default_rng(1).standard_normal((1, 98, 80)).astype(np.float32)
    (embedding,) = session.run(None, {session.get_inputs()[0].name: fbank})
    assert embedding.shape == (1, 192) and embedding.dtype == np.float32
    assert np.isfinite(embedding).all() and np.abs(embedding).max() > 0


def test_prompt_is_audible_audio_with_a_transcript(tmp_path: Path) -> None:
    write_prompt(tmp_path, np.random.default_rng(0))
    samples, rate = soundfile.read(str(tmp_path / "prompt.wav"))
    assert rate == PROMPT_SAMPLE_RATE
    assert 1.0 <= len(samples) / rate <= 30.0
    assert 0.05 < np.abs(samples).max() < 1.0
    assert (tmp_path / "prompt.txt").read_text().strip()
