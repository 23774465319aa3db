"""What a request's text may carry besides words, and how much speech it asks for.

Three kinds of markup reach us:
- CosyVoice 2's control tags (`CONTROL_TAGS`: `[laughter]`, `[breath]`, `<strong>…</strong>`
  ...). The model was trained on them; they pass through to the tokenizer, which maps each to
  one id. This tuple is the one list: the tokenizer registers exactly these after its three
  chat tokens.
- The model's own special tokens, `<|…|>` (`<|endofprompt|>` is instruct2's separator). In user
  text they would change what the model is told, so any is refused, naming it.
- SSML. Only the subset the model can do is kept: `<speak>` (dropped) and `<break>` (a pause
  between pieces, through the usual join). Any other element is refused, never read aloud.
  Its entities (`&lt;`, `&#60;`, `&#x3c;` ...) are decoded, so every rule is checked again on
  each decoding of the words (entities of entities too): `&lt;|im_start|&gt;` is the special
  token and `&lt;prosody&gt;` an element, both refused.
- Control characters other than tab and newline (C0, DEL, C1: `\r`, NEL, CSI ...), raw or
  decoded from an entity.

`parse_markup` is pure and torch-free: the producer runs it at submit and the worker again.
The speech estimate (`SpeechCount`: CJK characters per character, the rest per text token) is
here too, so both sides count alike.
"""

from __future__ import annotations

import html
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

# CosyVoice 2's documented control tags (upstream CosyVoice2Tokenizer's special tokens after
# <|im_start|>, <|im_end|>, <|endofprompt|>), in the order the tokenizer adds them.
CONTROL_TAGS = (
    "[breath]",
    "<strong>",
    "</strong>",
    "[noise]",
    "[laughter]",
    "[cough]",
    "[clucking]",
    "[accent]",
    "[quick_breath]",
    "<laughter>",
    "</laughter>",
    "[hissing]",
    "[sigh]",
    "[vocalized-noise]",
    "[lipsmack]",
    "[mn]",
)
CONTROL_TAG_RE = re.compile("|".join(re.escape(tag) for tag in CONTROL_TAGS))
# C0 controls but tab and newline, DEL, and C1 (U+0080-U+009F: NEL, CSI ...); "\r" too (a
# request's `text` reads CRLF and CR line ends as "\n" first: `text_file_lines`).
CONTROL_CHAR_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SSML_RE = re.compile(r"<speak\b", re.IGNORECASE)
_SHOWN_TOKEN_CHARS = 40
# Decodings of decodings checked (`&amp;lt;` is two deep): each is a pass over the text, so a
# text nested deeper (`&amp;amp;amp;...lt;`) is refused rather than decoded once per level.
MAX_ENTITY_DEPTH = 10
# An XML-ish element: <name attr="v" ...>, </name>, <name/>. "a < b > c" is not one.
_ELEMENT_RE = re.compile(
    r"<(?P<close>/)?(?P<name>[A-Za-z][\w:.-]*)"
    r"(?P<attrs>(?:\s+[\w:.-]+\s*=\s*(?:\"[^\"]*\"|'[^']*'))*)\s*(?P<empty>/)?\s*>"
)
_ATTR_RE = re.compile(r"([\w:.-]+)\s*=\s*(?:\"([^\"]*)\"|'([^']*)')")
_TIME_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*")
_CONTROL_ELEMENTS = frozenset({"strong", "laughter"})  # <strong>, <laughter> without attributes
# SSML's break strengths as pauses (seconds), close to what common engines use.
BREAK_STRENGTHS = {
    "none": 0.0,
    "x-weak": 0.1,
    "weak": 0.25,
    "medium": 0.5,
    "strong": 0.75,
    "x-strong": 1.0,
}
DEFAULT_BREAK_S = BREAK_STRENGTHS["medium"]
SUPPORTED_MARKUP = (
    '<speak>, <break time="500ms"/> or <break strength="strong"/>, '
    "<strong>…</strong>, <laughter>…</laughter> and the [tag] forms"
)

# Text read as written (a job or document sent as `plain`, Markdown's code): a "<" before a
# name, "/" or "|" ("Vector<int>", "<div>", "<|endoftext|>") is a character, not markup to
# refuse (nor a control tag or pause to obey); a space after it keeps it one.
_LITERAL_ANGLE_RE = re.compile(r"<(?=[A-Za-z/|])")

# Speech per text token after normalisation: ~3.3 Qwen2 tokens per second of read speech in
# English (~14 characters/s, ~4 characters/token) and in Chinese (~4.5 characters/s, ~1.4
# characters/token); CosyVoice 2 emits 25 speech tokens/s, i.e. ~7.5 per text token. The speech
# bound counts CJK characters per character instead (`CJK_SECONDS_PER_CHARACTER`).
SECONDS_PER_TEXT_TOKEN = 0.3
_WORD_OR_NUMBER_RE = re.compile(r"[^\W\d_]+|\d+")
# A high estimate of the same count from characters alone (the producer has no tokenizer), so
# that what the worker counts rarely exceeds it: Qwen2 makes ~0.25 tokens per Latin letter
# (taken as 0.35), ~0.7 per CJK or other-script character (taken as 1); a digit is read as ~1.7
# words ("1,234,567" -> "one million two hundred thirty four thousand ...": 12 words for 7
# digits; taken as 2.5 tokens); any other symbol may become a word ("%", "$", "&", "/": 1).
TOKENS_PER_CHARACTER = {"latin": 0.35, "other": 1.0, "digit": 2.5, "symbol": 1.0}
_LATIN_RE = re.compile(r"[A-Za-z]")
_DIGIT_RE = re.compile(r"\d")
_OTHER_LETTER_RE = re.compile(r"[^\W\d_A-Za-z]")
_SYMBOL_RE = re.compile(r"[^\w\s]|_")
# Chinese, Japanese and Korean are estimated per character, not per token, the same way at the
# producer and at the worker: a tokenizer's count of them says little about their speech (Qwen2
# makes 0.46 tokens of formal Chinese per character, 0.7-0.8 of prose, 1.2 of Cantonese; the
# tiny test model's byte BPE ~3), while each Han character or Hangul syllable is one spoken
# syllable and each kana about one mora. Read speech runs ~5 syllables/s in Mandarin (5.2 in
# Pellegrino et al. 2011, news reading 240-300 characters a minute) and in Korean (5-6), and
# ~8 morae/s in Japanese (7.8): 0.2 s per Han character or Hangul syllable, 0.125 s per kana.
# The rest of the text (Latin, digits ...) counts by its text tokens.
CJK_SECONDS_PER_CHARACTER = {"han": 0.2, "kana": 0.125, "hangul": 0.2}
_HAN = "\u3005-\u3007\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"  # 々〆〇 too
_KANA = "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9d"
_HANGUL = "\uac00-\ud7a3"
_CJK_PATTERNS = (re.compile(f"[{_HAN}]"), re.compile(f"[{_KANA}]"), re.compile(f"[{_HANGUL}]"))
CJK_RUN_RE = re.compile(f"[{_HAN}{_KANA}{_HANGUL}]+")  # what SpeechCount counts per character
# The submit floor of a word or number outside CJK characters: one text token (0.3 s), but in a
# text that holds CJK it may be read as one syllable (0.2 s: "5m" is 五米), so it counts as that.
_WORD_FLOOR_BESIDE_CJK_S = min(
    SECONDS_PER_TEXT_TOKEN, CJK_SECONDS_PER_CHARACTER["han"], CJK_SECONDS_PER_CHARACTER["hangul"]
)


@dataclass(frozen=True)
class Pause:
    """Silence asked for by an SSML <break>, between the text before and after it."""

    seconds: float


Segment = str | Pause


class MarkupError(ValueError):
    """Markup the service refuses; the message is the rule (the caller adds the field)."""


def first_special_token(text: str) -> str | None:
    """The first `<|…|>` in `text`, whole: from its first `<|` to the first `|>` after that (if
    none follows it, none follows a later `<|` either). What a lazy regex (`<|` any `|>`) finds, in
    one pass: the regex scanned on to the end from every `<|` of a text with no `|>`, so a
    document of `<|` repeated took the front minutes of CPU at submit (quadratic)."""
    start = text.find("<|")
    if start < 0:
        return None
    end = text.find("|>", start + 2)
    return None if end < 0 else text[start : end + 2]


def special_token(text: str) -> str | None:
    """The first `<|…|>` token in `text` (shortened for messages), or None."""
    found = first_special_token(text)
    return None if found is None else _shown_token(found)


def _shown_token(token: str) -> str:
    return token if len(token) <= _SHOWN_TOKEN_CHARS else token[: _SHOWN_TOKEN_CHARS - 5] + "...|>"


def _shown(markup: str) -> str:
    return (
        markup if len(markup) <= _SHOWN_TOKEN_CHARS else markup[: _SHOWN_TOKEN_CHARS - 4] + "...>"
    )


def is_ssml(text: str) -> bool:
    """A text with a <speak> element is SSML (its entities are decoded in the words)."""
    return _SSML_RE.search(text) is not None


def literal(text: str) -> str:
    """`text` with every "<" that could open markup made a character (`_LITERAL_ANGLE_RE`):
    "List<String>" -> "List< String>", "<|user|>" -> "< |user|>" (never a tag or a special
    token to the parser, the normaliser or the tokenizer)."""
    return _LITERAL_ANGLE_RE.sub("< ", text)


def refuse_special_tokens(text: str) -> None:
    found = first_special_token(text)
    if found is not None:
        raise MarkupError(
            f"contains the model's special token {_named(found)}; only these control "
            f"tags may appear in text: {', '.join(CONTROL_TAGS)}"
        )


def _named(token: str) -> str:
    """A whole `<|…|>` token as a user should read it, shortened: one with XML entities inside
    (`<|im_en&#100;|>`) is named by what it decodes to, its written form beside it. Decoded
    before shortening: a cut through an entity would decode to another name. At most
    `MAX_ENTITY_DEPTH` decodings: one per level of a deep token was quadratic in its length."""
    decoded = token
    for _ in range(MAX_ENTITY_DEPTH):
        if (again := html.unescape(decoded)) == decoded:
            break
        decoded = again
    if decoded == token:
        return _shown_token(token)
    return f"{special_token(decoded) or _shown_token(decoded)} (written {_shown_token(token)})"


def text_file_lines(value: str) -> str:
    """A text as a file saved on Windows or an old Mac holds it: its byte order mark dropped
    and its `\r\n` or `\r` line ends read as `\n` (a job's text and a document's alike; a
    carriage return is refused everywhere else)."""
    return value.replace("\r\n", "\n").replace("\r", "\n").removeprefix("\ufeff")


def refuse_control_characters(text: str) -> None:
    control = CONTROL_CHAR_RE.search(text)
    if control:
        raise MarkupError(
            f"contains control character U+{ord(control.group()):04X} "
            "(only tab and newline are allowed)"
        )


def _refuse_decoded_markup(decoded: str) -> None:
    """What an entity decoding made: no special token, control character or element (a
    decoded `<prosody>` would be read aloud, a decoded `<break/>` would not pause)."""
    token = special_token(decoded)
    if token is not None:
        raise MarkupError(
            f"contains the model's special token {token} written with XML entities; only these "
            f"control tags may appear in text: {', '.join(CONTROL_TAGS)}"
        )
    refuse_control_characters(decoded)
    for element in _ELEMENT_RE.finditer(decoded):
        name = element.group("name").lower()
        if name in _CONTROL_ELEMENTS and not element.group("attrs") and not element.group("empty"):
            continue  # <strong> as &lt;strong&gt;: the control tag either way
        raise MarkupError(
            f"markup {_shown(element.group())} written with XML entities is not supported "
            f"(supported: {SUPPORTED_MARKUP})"
        )


def decode_entities(words: str) -> str:
    """SSML words with their entities decoded once (what is read), after checking that no
    decoding, once or repeated until nothing changes, makes refused markup. Entities nested
    more than `MAX_ENTITY_DEPTH` deep are refused: a pass per level made a document of
    `&amp;amp;amp;...` quadratic (160,000 characters: 13 s of the front's CPU at submit)."""
    decoded = html.unescape(words)
    deeper = decoded
    for _ in range(MAX_ENTITY_DEPTH):
        _refuse_decoded_markup(deeper)
        again = html.unescape(deeper)
        if again == deeper:
            return decoded
        deeper = again
    raise MarkupError(
        f"XML entities nested more than {MAX_ENTITY_DEPTH} deep (&amp;amp;...); write each "
        "character once (&amp; for &)"
    )


def _break_seconds(attrs: str, shown: str, max_break_s: float) -> float:
    values = {
        m.group(1): m.group(2) if m.group(2) is not None else m.group(3)
        for m in _ATTR_RE.finditer(attrs)
    }
    unknown = sorted(set(values) - {"time", "strength"})
    if unknown:
        raise MarkupError(f"{shown}: attribute {unknown[0]} is not supported (time, strength)")
    if "time" in values:
        matched = _TIME_RE.fullmatch(values["time"])
        if matched is None:
            raise MarkupError(f"{shown}: time must be like 500ms or 1.5s")
        seconds = float(matched.group(1)) / (1000 if matched.group(2) == "ms" else 1)
    elif "strength" in values:
        if values["strength"] not in BREAK_STRENGTHS:
            raise MarkupError(f"{shown}: strength must be one of {', '.join(BREAK_STRENGTHS)}")
        seconds = BREAK_STRENGTHS[values["strength"]]
    else:
        seconds = DEFAULT_BREAK_S
    if seconds > max_break_s:
        raise MarkupError(f"{shown}: {seconds:g} s pause, limit {max_break_s:g} s")
    return seconds


def parse_markup(
    text: str, *, allow_breaks: bool = True, max_break_s: float = 10.0
) -> list[Segment]:
    """Text as words (control tags kept inline) and pauses; MarkupError for refused markup.

    A text with a <speak> element is SSML: its XML entities (&amp; &lt; ...) are decoded in the
    words. Adjacent words join; empty words are dropped. Special tokens and control characters
    are refused in the text, in the words once markup is taken out (`<</break>|im_start|>`) and
    in every decoding of their entities.
    """
    refuse_special_tokens(text)
    refuse_control_characters(text)
    ssml = is_ssml(text)
    segments: list[Segment] = []
    words: list[str] = []

    def flush() -> None:
        joined = "".join(words)
        words.clear()
        refuse_special_tokens(joined)
        if ssml:
            joined = decode_entities(joined)
        if joined.strip():
            segments.append(joined)

    position = 0
    for element in _ELEMENT_RE.finditer(text):
        words.append(text[position : element.start()])
        position = element.end()
        name, shown = element.group("name").lower(), _shown(element.group())
        if name in _CONTROL_ELEMENTS and not element.group("attrs") and not element.group("empty"):
            words.append(f"<{'/' if element.group('close') else ''}{name}>")
        elif name == "speak":
            words.append(" ")
        elif name == "break" and allow_breaks:
            if element.group("close"):
                continue  # <break ...></break>: the opening tag already made the pause
            flush()
            segments.append(Pause(_break_seconds(element.group("attrs"), shown, max_break_s)))
        elif name == "break":
            raise MarkupError(f"{shown}: pauses are not allowed here")
        else:
            raise MarkupError(f"markup {shown} is not supported (supported: {SUPPORTED_MARKUP})")
    words.append(text[position:])
    flush()
    return segments


def words_breaks(segments: list[Segment]) -> int:
    """How many places pauses cut the words into stretches (each stretch is a piece of its
    own; pauses side by side are one gap)."""
    return max(0, sum(isinstance(s, str) for s in segments) - 1)


def refuse_many_breaks(segments: list[Segment], limit: int) -> None:
    """More than `limit` pauses between words: each stretch of words is a piece the model
    conditions on the whole voice prompt again (100 one-word pieces: 4x the CPU per second of
    audio of the same words as one text, on the tiny model), at no cost to the speech bound."""
    breaks = words_breaks(segments)
    if breaks > limit:
        raise MarkupError(
            f"{breaks:,} <break>s between words, limit {limit:,} (COSYQ_MAX_BREAKS): each starts "
            "a piece the model conditions on the whole voice prompt again"
        )


def pause_seconds(segments: list[Segment]) -> float:
    return sum(s.seconds for s in segments if isinstance(s, Pause))


def text_of(segments: list[Segment]) -> str:
    """The words of parsed markup, pauses as a space (what a transcript check looks at)."""
    return " ".join(s.strip() for s in segments if isinstance(s, str))


def speech_seconds(text_tokens: int, pauses_s: float = 0.0) -> float:
    """Estimated audio length of `text_tokens` text tokens plus pauses (at speed 1: speed does
    not change how many speech tokens the LLM generates)."""
    return text_tokens * SECONDS_PER_TEXT_TOKEN + pauses_s


def minimum_text_tokens(text: str) -> int:
    """A floor on the text tokens `text` becomes after normalisation, without the model: every
    run of letters or of digits is at least one Qwen2 token (its pre-tokenizer never joins two
    such runs, and a number is spoken as at least one word). Applied to the rest of a text
    beside its CJK characters (`SpeechCount`), which count per character."""
    return len(_WORD_OR_NUMBER_RE.findall(CONTROL_TAG_RE.sub(" ", text)))


@dataclass(frozen=True)
class SpeechCount:
    """What a text's speech estimate counts: its Chinese, Japanese and Korean characters, each
    at its seconds (`CJK_SECONDS_PER_CHARACTER`), and the text tokens of the rest. The producer
    and the worker count CJK characters with the same code, so for a text of only those the two
    estimates are equal; the rest is counted by the producer at its floor (one per word or
    number) and by the worker with the model's tokenizer."""

    han: int = 0  # Han characters
    kana: int = 0
    hangul: int = 0  # Hangul syllables
    tokens: int = 0  # of the rest: the spans between CJK characters that hold a letter or digit

    @classmethod
    def of(
        cls, text: str, count_tokens: Callable[[str], int], *, whole_tokens: int | None = None
    ) -> SpeechCount:
        """`count_tokens` is given each span between CJK characters that holds a letter or a
        digit, stripped; `whole_tokens`, the text's own count when known, stands for it in a
        text without CJK."""
        han, kana, hangul = (len(pattern.findall(text)) for pattern in _CJK_PATTERNS)
        if not han + kana + hangul:
            tokens = whole_tokens if whole_tokens is not None else count_tokens(text.strip())
            return cls(tokens=tokens if _speakable(text) else 0)
        spans = (span.strip() for span in CJK_RUN_RE.split(text))
        return cls(han, kana, hangul, sum(count_tokens(span) for span in spans if _speakable(span)))

    def __add__(self, other: SpeechCount) -> SpeechCount:
        return SpeechCount(
            self.han + other.han,
            self.kana + other.kana,
            self.hangul + other.hangul,
            self.tokens + other.tokens,
        )

    @property
    def cjk_characters(self) -> int:
        return self.han + self.kana + self.hangul

    @property
    def cjk_s(self) -> float:
        """The CJK characters' speech, from whole counts: equal wherever they are equal."""
        rates = CJK_SECONDS_PER_CHARACTER
        return self.han * rates["han"] + self.kana * rates["kana"] + self.hangul * rates["hangul"]

    def seconds(self, pauses_s: float = 0.0) -> float:
        """The worker's estimate: CJK characters at their seconds, the rest's real tokens."""
        return self.cjk_s + speech_seconds(self.tokens, pauses_s)

    def floor_seconds(self, pauses_s: float = 0.0) -> float:
        """The producer's estimate, `tokens` being its floor of one per word or number: never
        above what the worker counts. Beside CJK characters a word or number may be read as one
        syllable (5m is 五米), so there each counts as that (0.2 s), else as one token."""
        per_word = _WORD_FLOOR_BESIDE_CJK_S if self.cjk_characters else SECONDS_PER_TEXT_TOKEN
        return self.cjk_s + self.tokens * per_word + pauses_s

    def describe(self, *rest: str) -> str:
        """The count for a message: "1,000 Chinese, Japanese or Korean characters, 200 s at ..."
        before the parts of `rest` that are not empty, joined by semicolons."""
        rates = CJK_SECONDS_PER_CHARACTER
        cjk = (
            f"{self.cjk_characters:,} Chinese, Japanese or Korean characters, "
            f"{self.cjk_s:,.0f} s at {rates['han']:g} s a Han character or Hangul syllable "
            f"and {rates['kana']:g} s a kana"
        )
        return "; ".join(([cjk] if self.cjk_characters else []) + [part for part in rest if part])


def _speakable(text: str) -> bool:
    return any(unicodedata.category(c)[0] in ("L", "N") for c in text)


def estimated_text_tokens(text: str) -> int:
    """A high estimate of the text tokens `text` becomes after normalisation, from its
    characters (`TOKENS_PER_CHARACTER`), never below `minimum_text_tokens`: a document's
    segments are sized by it, so the worker's own count of a segment is rarely over its limit."""
    return TextCounts.of(text).estimated_tokens()


@dataclass(frozen=True)
class TextCounts:
    """What `estimated_text_tokens` counts in a text. Two texts joined by a space count the sum
    (no run of letters or digits, and no control tag, spans a space), so a splitter can size a
    growing segment by adding its parts' counts instead of counting it again at each step."""

    latin: int = 0
    other: int = 0
    digit: int = 0
    symbol: int = 0
    words: int = 0  # runs of letters or of digits: `minimum_text_tokens`

    @classmethod
    def of(cls, text: str) -> TextCounts:
        words = CONTROL_TAG_RE.sub(" ", text)
        return cls(
            latin=len(_LATIN_RE.findall(words)),
            other=len(_OTHER_LETTER_RE.findall(words)),
            digit=len(_DIGIT_RE.findall(words)),
            symbol=len(_SYMBOL_RE.findall(words)),
            words=len(_WORD_OR_NUMBER_RE.findall(words)),
        )

    def __add__(self, other: TextCounts) -> TextCounts:
        return TextCounts(
            self.latin + other.latin,
            self.other + other.other,
            self.digit + other.digit,
            self.symbol + other.symbol,
            self.words + other.words,
        )

    def estimated_tokens(self) -> int:
        rates = TOKENS_PER_CHARACTER
        estimate = (
            rates["latin"] * self.latin
            + rates["other"] * self.other
            + rates["digit"] * self.digit
            + rates["symbol"] * self.symbol
        )
        return max(math.ceil(estimate), self.words)


def speech_limit_message(estimate_s: float, limit_s: float, detail: str) -> str:
    return (
        f"about {estimate_s:,.0f} s of speech ({detail}), limit {limit_s:,.0f} s "
        "(COSYQ_MAX_SPEECH_SECONDS): split the text into several requests"
    )
