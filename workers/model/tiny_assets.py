"""The non-checkpoint files of a tiny model directory: tokenizer, ONNX stand-ins, prompt.

Real CosyVoice2-0.5B weights cannot be shipped or downloaded in tests, so `init-tiny` writes a
directory in the official layout whose every file is small and random but has the real one's
format: a byte-level BPE tokenizer trained on a short corpus, the two prompt models as small ONNX
graphs with the real input/output names, dtypes and ranks, and a synthetic prompt recording.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import soundfile
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, trainers
from tokenizers.pre_tokenizers import ByteLevel

from workers.model.tokenizer import END_OF_TEXT, qwen2_pipeline

SPEECH_TOKENIZER_FRAMES_PER_TOKEN = 4  # 100 Hz log-mel frames -> 25 Hz tokens (two stride-2 convs)
SPEAKER_EMBEDDING_DIM = 192
WHISPER_MELS = 128
FBANK_BINS = 80
ONNX_OPSET = 18
PROMPT_SAMPLE_RATE = 24000
PROMPT_SECONDS = 2.0
PROMPT_TRANSCRIPT = "This is the tiny model's built-in voice prompt."
_QWEN_FILE_SPECIALS = (END_OF_TEXT, "<|im_start|>", "<|im_end|>")

_CORPUS = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.",
    "Hello, world! How are you today? I'm fine, thanks; and you?",
    "Speech synthesis turns written text into natural sounding audio, one sentence at a time.",
    "Queues, workers and storage: a job goes in, a waveform comes out, and the result says where.",
    "Numbers like 1, 2, 3, 42, 2026 and 3.14 are read aloud after normalisation.",
    "今天天气很好，我们一起去公园散步吧。",
    "收到朋友从远方寄来的生日礼物，那份意外的惊喜让我心中充满了甜蜜的快乐。",
    "希望你以后能够做的比我还好呦。",
    "こんにちは、世界。音声合成のテストです。",
)


def write_tokenizer(folder: Path, text_vocab_size: int, n_special: int) -> int:
    """Train a byte-level BPE whose ids (plus specials) fit `text_vocab_size`; return its size."""
    folder.mkdir(parents=True, exist_ok=True)
    base_size = text_vocab_size - len(_QWEN_FILE_SPECIALS) - n_special
    if base_size < 256 + 1:
        raise ValueError(f"text vocabulary {text_vocab_size} too small for a byte-level BPE")
    tokenizer = qwen2_pipeline(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=base_size, initial_alphabet=ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(list(_CORPUS) * 4, trainer=trainer)
    tokenizer.model.save(str(folder))
    vocab_size = len(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    added = {
        str(vocab_size + i): {
            "content": token,
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for i, token in enumerate(_QWEN_FILE_SPECIALS)
    }
    config = {
        "added_tokens_decoder": added,
        "eos_token": END_OF_TEXT,
        "pad_token": END_OF_TEXT,
        "model_max_length": 32768,
        "tokenizer_class": "Qwen2Tokenizer",
        "errors": "replace",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return vocab_size + len(_QWEN_FILE_SPECIALS)


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
        producer_name="cosyq-init-tiny",
    )
    model.ir_version = 9  # onnxruntime >= 1.15 reads it
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def write_speech_tokenizer(path: Path, rng: np.random.Generator, speech_vocab: int) -> None:
    """(1,128,T) float32 log-mel + (1,) int32 length -> (1, ceil(T/4)) int64 token ids.

    Two argmaxes over sqrt(vocab)-way projections combine into ids covering the whole vocabulary.
    The length input is accepted (the front end passes it by position) but not needed here.
    """
    side = int(np.ceil(np.sqrt(speech_vocab)))
    k = SPEECH_TOKENIZER_FRAMES_PER_TOKEN
    weight = rng.standard_normal((2 * side, WHISPER_MELS, k)).astype(np.float32)
    nodes = [
        helper.make_node(
            "Conv", ["feats", "w"], ["proj"], strides=[k], kernel_shape=[k], auto_pad="SAME_UPPER"
        ),
        helper.make_node("Split", ["proj", "halves"], ["hi", "lo"], axis=1),
        helper.make_node("ArgMax", ["hi"], ["hi_id"], axis=1, keepdims=0),
        helper.make_node("ArgMax", ["lo"], ["lo_id"], axis=1, keepdims=0),
        helper.make_node("Mul", ["hi_id", "side"], ["hi_scaled"]),
        helper.make_node("Add", ["hi_scaled", "lo_id"], ["combined"]),
        helper.make_node("Mod", ["combined", "vocab"], ["indices"]),
    ]
    initializers = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(np.array([side, side], dtype=np.int64), "halves"),
        numpy_helper.from_array(np.array(side, dtype=np.int64), "side"),
        numpy_helper.from_array(np.array(speech_vocab, dtype=np.int64), "vocab"),
    ]
    graph = helper.make_graph(
        nodes,
        "speech_tokenizer_standin",
        [
            helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, WHISPER_MELS, "T"]),
            helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1]),
        ],
        [helper.make_tensor_value_info("indices", TensorProto.INT64, [1, "n_tokens"])],
        initializers,
    )
    _save(graph, path)


def write_speaker_model(path: Path, rng: np.random.Generator) -> None:
    """(1,T,80) float32 fbank -> (1,192) float32 embedding (time-mean, projection, tanh)."""
    weight = (rng.standard_normal((FBANK_BINS, SPEAKER_EMBEDDING_DIM)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMean", ["input", "time_axis"], ["pooled"], keepdims=0),
        helper.make_node("MatMul", ["pooled", "w"], ["projected"]),
        helper.make_node("Tanh", ["projected"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes,
        "campplus_standin",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", FBANK_BINS])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, SPEAKER_EMBEDDING_DIM])],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.array([1], dtype=np.int64), "time_axis"),
        ],
    )
    _save(graph, path)


def write_prompt(folder: Path, rng: np.random.Generator) -> None:
    """A voiced, pitch-gliding, syllable-modulated signal and its (fictional) transcript."""
    n = int(PROMPT_SECONDS * PROMPT_SAMPLE_RATE)
    t = np.arange(n) / PROMPT_SAMPLE_RATE
    f0 = 140.0 + 30.0 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / PROMPT_SAMPLE_RATE
    voiced = sum(np.sin(h * phase) / h for h in range(1, 12))
    syllables = (
        0.5
        * (1 - np.cos(2 * np.pi * 4.0 * t))
        * np.minimum(1.0, 5 * t)
        * np.minimum(1.0, 5 * (PROMPT_SECONDS - t))
    )
    signal = 0.25 * voiced * syllables + 0.005 * rng.standard_normal(n)
    soundfile.write(
        str(folder / "prompt.wav"), signal.astype(np.float32), PROMPT_SAMPLE_RATE, subtype="PCM_16"
    )
    (folder / "prompt.txt").write_text(PROMPT_TRANSCRIPT + "\n", encoding="utf-8")
