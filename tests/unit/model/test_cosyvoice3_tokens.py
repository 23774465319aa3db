"""CosyVoice 3's 280 added text tokens land on the reference set's ids (151644..151923)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers.pre_tokenizers import ByteLevel

from workers.model.cosyvoice3_tokens import COSYVOICE3_SPECIAL_TOKENS
from workers.model.tokenizer import load_text_tokenizer

QWEN_BASE = 151643  # ordinary tokens of the real Qwen2 vocabulary
FILE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _real_shaped_folder(folder: Path) -> Path:
    """A vocabulary of the real shape: the byte alphabet, fillers up to 151643, no merges."""
    alphabet = sorted(ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate(alphabet)}
    vocab |= {f"filler{i}": i for i in range(len(alphabet), QWEN_BASE)}
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n", encoding="utf-8")
    added = {
        str(QWEN_BASE + i): {"content": token, "special": True}
        for i, token in enumerate(FILE_SPECIALS)
    }
    config = {"added_tokens_decoder": added}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def test_cosyvoice3_tokens_get_the_reference_ids(reference3_dir: Path, tmp_path: Path) -> None:
    table = json.loads((reference3_dir / "config.json").read_text())["text_tokenizer"]["ids"]
    tokenizer = load_text_tokenizer(
        _real_shaped_folder(tmp_path), specials=COSYVOICE3_SPECIAL_TOKENS
    )
    assert len(COSYVOICE3_SPECIAL_TOKENS) == 280 == len(table)
    assert {token: tokenizer.token_id(token) for token in table} == table
    assert tokenizer.size == 151924
    assert tokenizer.encode("[j][ǐ]<|endofprompt|>") == [table["[j]"], table["[ǐ]"], 151646]
