"""The Qwen2 byte-level BPE text tokenizer of `CosyVoice-BlankEN/`, without transformers.

The directory holds `vocab.json`, `merges.txt` and `tokenizer_config.json` (whose
`added_tokens_decoder` lists `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` after the base
vocabulary). CosyVoice 2 then appends its own special tokens in a fixed order, so with the real
vocabulary `<|endofprompt|>` lands on id 151646. We rebuild exactly that with the `tokenizers`
library and check every id instead of trusting the order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from shared.errors import ModelLoadError
from shared.text_markup import CONTROL_TAGS

# Qwen2's pre-tokenizer split (the same regex its tokenizer.json carries).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Added by CosyVoice2Tokenizer, in this order, after the tokenizer's own added tokens: three
# chat tokens, then the control tags user text may carry (the one list, in shared/).
COSYVOICE2_SPECIAL_TOKENS = ("<|im_start|>", "<|im_end|>", "<|endofprompt|>", *CONTROL_TAGS)
END_OF_TEXT = "<|endoftext|>"
END_OF_PROMPT = "<|endofprompt|>"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")


def qwen2_pipeline(tokenizer: Tokenizer) -> Tokenizer:
    """Give a BPE tokenizer Qwen2's normaliser, pre-tokenizer and decoder."""
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _file_added_tokens(config_path: Path) -> list[tuple[int, str]]:
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        decoder = config.get("added_tokens_decoder", {})
        return sorted((int(i), str(entry["content"])) for i, entry in decoder.items())
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelLoadError(f"{config_path}: unreadable tokenizer config ({e})") from e


@dataclass(frozen=True)
class TextTokenizer:
    """Text to token ids the way CosyVoice 2 does it: no BOS/EOS, specials as single ids."""

    tokenizer: Tokenizer
    user_tokens: frozenset[str] = frozenset(CONTROL_TAGS)  # added tokens user text may carry

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def token_id(self, token: str) -> int:
        found = self.tokenizer.token_to_id(token)
        if found is None:
            raise KeyError(token)
        return int(found)

    @cached_property
    def special_tokens(self) -> dict[int, str]:
        """Every token the tokenizer adds to its vocabulary but the control tags user text may
        carry (`<|endoftext|>`, `<|im_start|>`, `<|endofprompt|>` ...), by id: never from user
        text."""
        added = self.tokenizer.get_added_tokens_decoder()
        allowed = self.user_tokens
        return {int(i): t.content for i, t in added.items() if t.content not in allowed}

    @property
    def size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))


def load_text_tokenizer(
    folder: Path,
    *,
    specials: Sequence[str] = COSYVOICE2_SPECIAL_TOKENS,
    user_tokens: Sequence[str] = CONTROL_TAGS,
) -> TextTokenizer:
    """Build the tokenizer from `folder` (CosyVoice-BlankEN) and check the special-token ids.

    `specials`: the family's added tokens, in order (CosyVoice 3:
    `workers.model.cosyvoice3_tokens.COSYVOICE3_SPECIAL_TOKENS`); `user_tokens`: those of them
    user text may carry (the control tags; CosyVoice 3 also its phone and pinyin tokens)."""
    for name in TOKENIZER_FILES:
        if not (folder / name).is_file():
            raise ModelLoadError(f"{folder / name}: file missing (Qwen2 tokenizer file)")
    try:
        vocab, merges = models.BPE.read_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
        tokenizer = qwen2_pipeline(Tokenizer(models.BPE(vocab, merges)))
    except Exception as e:  # tokenizers raises plain Exceptions for malformed files
        raise ModelLoadError(f"{folder}: vocab.json/merges.txt unreadable ({e})") from e
    base = len(vocab)
    for token_id, content in _file_added_tokens(folder / "tokenizer_config.json"):
        tokenizer.add_special_tokens([AddedToken(content, special=True, normalized=False)])
        if tokenizer.token_to_id(content) != token_id:
            raise ModelLoadError(
                f"{folder / 'tokenizer_config.json'}: {content} should have id {token_id}, "
                f"got {tokenizer.token_to_id(content)} (base vocabulary has {base} entries)"
            )
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return TextTokenizer(tokenizer, frozenset(user_tokens))
