"""Text side of the front end: markup, normalisation, splitting into pieces, Qwen2 token ids.

The request's text is first read as markup (`shared.text_markup`: control tags kept, `<|…|>`
tokens and unsupported markup refused, SSML breaks as pauses). Each stretch of words between
pauses is normalised (`normalizer`: numbers, dates, units spelled out, each span of one
script in its language), split into pieces (`text_split`) and each piece tokenized; a pause
becomes the gap before the next piece. The prompt transcript is normalised but never split;
the instruction of instruct2 is not normalised and gets the <|endofprompt|> separator from us.
Normalisation is skipped when the `normalize_text` setting is off (text already written as it
should be spoken). What the tokenizer is given is checked once more, on exactly that text and
on its ids: no special token may come from user text, whatever decoding or normalisation made
it.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

from shared.errors import EmptyTextError, InvalidRequestError
from shared.invisible import strip_invisible
from shared.sentences import CLOSING, SENTENCE_END
from shared.text_markup import (
    CONTROL_TAG_RE,
    CONTROL_TAGS,
    MarkupError,
    Pause,
    parse_markup,
    refuse_special_tokens,
)
from workers.engine.normalizer import Language, TextNormalizer, choose_language
from workers.engine.text_split import SplitConfig, split_text
from workers.model.tokenizer import END_OF_PROMPT, TextTokenizer

_CJK_CHAR_RE = re.compile("[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef]")  # CJK, kana, full-width


def speakable(text: str) -> bool:
    """True if `text` holds a letter or digit (a piece of only punctuation is dropped)."""
    return any(unicodedata.category(c)[0] in ("L", "N") for c in text)


def with_final_stop(text: str) -> str:
    """Upstream ends a text without final punctuation with "." (or "。" after CJK). A sentence
    ended inside its closing quotes is ended: 「…ですね。」 and “…吗？” get no 。 after them."""
    words = text.rstrip("".join(CLOSING))
    if not words or words[-1] in SENTENCE_END:
        return text
    return text + ("。" if _CJK_CHAR_RE.fullmatch(words[-1]) else ".")


@dataclass(frozen=True)
class TextPiece:
    """One piece of the TTS text, its token ids and the pauses an SSML <break> asked for
    (`pause_before_s` None: the usual gap between pieces)."""

    text: str
    ids: tuple[int, ...]
    pause_before_s: float | None = None
    pause_after_s: float = 0.0


def _markup(text: str, field: str, *, allow_breaks: bool = True) -> list[str | Pause]:
    try:  # the gate checked the break limit already; here only what can never be spoken
        return parse_markup(text, allow_breaks=allow_breaks, max_break_s=math.inf)
    except MarkupError as e:
        raise InvalidRequestError(f"{field}: {e}") from e


def _kept_tags(tokenizer: TextTokenizer) -> re.Pattern[str]:
    """What normalisation passes through as written: the tokens user text may carry."""
    if tokenizer.user_tokens == frozenset(CONTROL_TAGS):
        return CONTROL_TAG_RE
    tags = sorted(tokenizer.user_tokens, key=lambda t: (-len(t), t))  # longest first
    return re.compile("|".join(re.escape(t) for t in tags))


class TextFrontend:
    """Text -> token ids for each LLM input."""

    def __init__(
        self, tokenizer: TextTokenizer, *, normalize: bool = True, split: SplitConfig | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.normalizer = TextNormalizer(enabled=normalize, kept=_kept_tags(tokenizer))
        self.split = split or SplitConfig()

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def pieces(
        self,
        text: str,
        *,
        language: str = "auto",
        transcript: str = "",
        field: str = "text",
        raw: bool = False,
    ) -> list[TextPiece]:
        """The TTS text as normalised, tokenized pieces; EmptyTextError if nothing is left.

        `language` "auto" reads each span in its script's language (a stretch of no letters in
        the whole text's, else the voice `transcript`'s, else en); en, zh or ja is also the
        Latin spans' language. `raw`: each stretch between pauses is one piece as written,
        neither normalised nor split (CosyVoice 3's cross_lingual, as upstream does).
        """
        segments = _markup(text, field)
        words = " ".join(s for s in segments if isinstance(s, str))
        spoken_in = (language, choose_language(language, words, transcript))
        last_words = max((i for i, s in enumerate(segments) if isinstance(s, str)), default=-1)
        pieces: list[TextPiece] = []
        pause: float | None = None
        for index, segment in enumerate(segments):
            if isinstance(segment, Pause):
                pause = (pause or 0.0) + segment.seconds
                continue
            final = index == last_words
            if raw:
                chunks = [strip_invisible(segment).strip()]
            else:
                chunks = self._chunks(segment, spoken_in, final=final)
            for chunk in filter(speakable, chunks):
                pieces.append(TextPiece(chunk, tuple(self.user_ids(chunk, field)), pause))
                pause = None
        if not pieces:
            raise EmptyTextError(
                f"{field}: nothing to speak after normalisation (only spaces or punctuation)"
            )
        if pause:
            last = pieces[-1]
            pieces[-1] = TextPiece(last.text, last.ids, last.pause_before_s, pause)
        return pieces

    def _chunks(self, words: str, spoken_in: tuple[str, Language], *, final: bool) -> list[str]:
        language, no_letters = spoken_in
        normalised = self.normalizer(words, language, no_letters=no_letters)
        if final and self.normalizer.enabled:
            normalised = with_final_stop(normalised)
        return [c for c in split_text(normalised, self.count_tokens, self.split) if speakable(c)]

    def prompt_text_ids(self, transcript: str) -> list[int]:
        """The prompt's transcript, normalised as one piece (zero_shot), in its own language."""
        words = " ".join(
            s for s in _markup(transcript, "prompt_text", allow_breaks=False) if isinstance(s, str)
        )
        return self.user_ids(self.normalizer(words, "auto"), "prompt_text")

    def raw_prompt_text_ids(self, transcript: str) -> list[int]:
        """The prompt's transcript as written (CosyVoice 3: its prompt text holds
        <|endofprompt|>, so upstream never normalises it)."""
        words = " ".join(
            s for s in _markup(transcript, "prompt_text", allow_breaks=False) if isinstance(s, str)
        )
        return self.user_ids(strip_invisible(words).strip(), "prompt_text")

    def instruction_ids(self, instruction: str) -> list[int]:
        """instruct2's instruction, not normalised, ending in <|endofprompt|> (added by us; one
        the caller wrote at the end, as upstream expects, is not doubled). Any other special
        token is refused."""
        text = instruction.strip().removesuffix(END_OF_PROMPT)
        self.user_ids(text, "instruction")
        ids = self.tokenizer.encode(text + END_OF_PROMPT)
        self._refuse_special_ids(ids[:-1], "instruction")
        return ids

    def user_ids(self, text: str, field: str) -> list[int]:
        """Token ids of user text, checked on exactly what the tokenizer is given: no `<|…|>`
        in it and no special id out of it (InvalidRequestError naming the token)."""
        try:
            refuse_special_tokens(text)
        except MarkupError as e:
            raise InvalidRequestError(f"{field}: {e}") from e
        ids = self.tokenizer.encode(text)
        self._refuse_special_ids(ids, field)
        return ids

    def _refuse_special_ids(self, ids: list[int], field: str) -> None:
        special = self.tokenizer.special_tokens
        found = next((i for i in ids if i in special), None)
        if found is not None:
            raise InvalidRequestError(
                f"{field}: contains the model's special token {special[found]} (id {found})"
            )
