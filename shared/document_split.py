"""A long document -> segments that each fit one ordinary job, at natural boundaries.

Reading: plain text is paragraphs separated by blank lines (sent as `plain`, not `auto`, its
angle brackets are characters: "List<String>" is read, not refused as markup); Markdown
(markdown-it-py) gives headings and paragraphs (list items and quotes are paragraphs, a GFM
table's row one of its cells; code blocks are not read aloud; a code span's angle brackets are
characters, never markup);
SSML goes through the one markup parser (`shared.text_markup.parse_markup`), its blank lines
separating paragraphs and its `<break>`s kept as pauses. Every paragraph of plain text and
Markdown goes through the same parser, so refused markup is refused here, at submit.

Splitting: sentences (`shared.sentences`, the engine's rule) are packed into segments of at most
`max_chars` characters and `max_speech_s` estimated seconds: Chinese, Japanese and Korean
characters as the worker's speech bound counts them (`SpeechCount`: 0.2 s a Han character or
Hangul syllable, 0.125 s a kana), the rest by `estimated_text_tokens` (a high estimate from
characters, digits counted as the words they become, since the producer has no tokenizer; the
worker speaks a segment its own count finds longer piece by piece, never refuses it). A growing
segment's size is kept as its parts are added (`Size`), never measured again from its start, so
splitting is linear in the text whatever its sentences' lengths. A segment never ends inside a
sentence unless that sentence alone is too long: then it is cut at clause marks, then between
words. Inside a segment a paragraph or heading boundary is written as a
`<break>` of its pause, so the job makes the same pause a segment boundary would; between
segments the assembler inserts `pause_before_s`. An SSML `<break>` at a boundary replaces the
boundary's pause, as a break replaces the gap between pieces inside a job.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Literal

from shared.sentences import split_sentences
from shared.text_markup import (
    CJK_RUN_RE,
    Pause,
    SpeechCount,
    TextCounts,
    literal,
    parse_markup,
    speech_seconds,
)

Markup = Literal["auto", "plain", "markdown", "ssml"]
Boundary = Literal["start", "sentence", "paragraph", "heading"]
_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n+")
_CLAUSE_RE = re.compile(r"(?<=[,，、;；:：])\s*")
_WORD_RE = re.compile(r"(?<=\s)(?=\S)")


@dataclass(frozen=True)
class Pauses:
    """Silence (seconds) at each kind of boundary."""

    sentence: float = 0.1
    paragraph: float = 0.6
    heading: float = 0.9

    def at(self, boundary: Boundary) -> float:
        return 0.0 if boundary == "start" else float(getattr(self, boundary))


@dataclass(frozen=True)
class SplitLimits:
    """How large one segment may be."""

    max_chars: int = 1000
    max_speech_s: float = 90.0
    max_break_s: float = 10.0
    max_breaks: int = 50  # pauses between words (a job's COSYQ_MAX_BREAKS)


@dataclass(frozen=True)
class Block:
    """A paragraph or a heading: its words and SSML pauses, in order."""

    kind: Literal["paragraph", "heading"]
    parts: list[str | Pause]


@dataclass(frozen=True)
class DocumentSegment:
    """One job's worth of the document."""

    index: int
    text: str  # what the job is given (breaks as <break>; SSML wrapped in <speak>)
    plain: str  # the words alone (manifest, captions)
    pause_before_s: float  # silence the assembler puts before it (0 for the first)
    boundary: Boundary  # what kind of boundary precedes it


def detect_markup(text: str, markup: Markup) -> Markup:
    """`auto`: SSML when the text starts with <speak>, else plain."""
    if markup != "auto":
        return markup
    return "ssml" if text.lstrip().startswith("<speak") else "plain"


def read_blocks(text: str, markup: Markup, *, max_break_s: float = 10.0) -> list[Block]:
    """The document's paragraphs and headings; MarkupError for refused markup."""
    kind = detect_markup(text, markup)
    if kind == "ssml":
        return _ssml_blocks(text, max_break_s)
    if kind == "markdown":
        raw = _markdown_blocks(text)
    else:
        raw = [("paragraph", part) for part in _BLANK_LINE_RE.split(text)]
    blocks = []
    for block_kind, words in raw:
        written = literal(words) if markup == "plain" else words
        parts = parse_markup(" ".join(written.split()), max_break_s=max_break_s)
        if parts:
            blocks.append(Block(block_kind, parts))  # type: ignore[arg-type]
    return blocks


def _ssml_blocks(text: str, max_break_s: float) -> list[Block]:
    blocks: list[Block] = []
    current: list[str | Pause] = []
    for part in parse_markup(text, max_break_s=max_break_s):
        if isinstance(part, Pause):
            current.append(part)
            continue
        paragraphs = _BLANK_LINE_RE.split(part)
        for number, paragraph in enumerate(paragraphs):
            if number and current:
                blocks.append(Block("paragraph", current))
                current = []
            if " ".join(paragraph.split()):
                current.append(" ".join(paragraph.split()))
    if current:
        blocks.append(Block("paragraph", current))
    return blocks


def _markdown_blocks(text: str) -> list[tuple[str, str]]:
    """(kind, words) per heading, paragraph and table row (GFM tables: a row is read as its
    cells, "指标, 旧版本, 新版本", never as its pipes and the dashes of its rule); inline markup
    reduced to its words."""
    from markdown_it import MarkdownIt  # noqa: PLC0415 (only Markdown documents need it)

    tokens = MarkdownIt("commonmark").enable("table").parse(text)
    blocks: list[tuple[str, str]] = []
    row: list[str] = []
    for index, token in enumerate(tokens):
        if token.type == "tr_close":
            blocks.append(("paragraph", ", ".join(cell for cell in row if cell.strip())))
            row = []
        if token.type != "inline" or index == 0:
            continue
        opener = tokens[index - 1].type
        if opener in ("th_open", "td_open"):
            row.append(_inline_words(token))
        elif opener in ("heading_open", "paragraph_open"):
            kind = "heading" if opener == "heading_open" else "paragraph"
            blocks.append((kind, _inline_words(token)))
    return blocks


def _inline_words(token: Any) -> str:
    """The words of an inline token: text, code spans as characters, breaks as spaces."""
    words = []
    for child in token.children or []:
        if child.type == "text":
            words.append(child.content)
        elif child.type == "code_inline":
            words.append(literal(child.content))
        elif child.type in ("softbreak", "hardbreak"):
            words.append(" ")
        elif child.type == "image":
            words.append(child.content)
    return "".join(words)


@dataclass(frozen=True)
class Words:
    """What a segment's speech is estimated from: its CJK characters (`SpeechCount`, as the
    worker counts them) and the text counts of the rest (the stretches between them that hold a
    letter or digit: punctuation between CJK characters is silent, as the worker counts it)."""

    cjk: SpeechCount = field(default_factory=SpeechCount)
    rest: TextCounts = field(default_factory=TextCounts)

    @classmethod
    def of(cls, text: str) -> Words:
        rest = (TextCounts.of(s) for s in CJK_RUN_RE.split(text) if has_words(s))
        return cls(SpeechCount.of(text, lambda _: 0), sum(rest, TextCounts()))

    def __add__(self, other: Words) -> Words:
        return Words(self.cjk + other.cjk, self.rest + other.rest)

    def seconds(self, pauses_s: float = 0.0) -> float:
        return self.cjk.cjk_s + speech_seconds(self.rest.estimated_tokens(), pauses_s)


@dataclass(frozen=True)
class Size:
    """A segment's measure: its rendered characters (parts joined by spaces, without SSML's
    <speak>), the counts of its words and its pauses. Each added part adds its own."""

    chars: int = 0
    parts: int = 0
    counts: Words = field(default_factory=Words)
    pauses_s: float = 0.0
    breaks: int = 0  # pauses between words (`text_markup.words_breaks`)
    words: bool = False  # words so far
    paused: bool = False  # a pause since the last words

    def plus(self, part: str | Pause, *, ssml: bool) -> Size:
        chars = self.chars + len(_render_part(part, ssml)) + (1 if self.parts else 0)
        if isinstance(part, Pause):
            seconds = self.pauses_s + part.seconds
            return Size(chars, self.parts + 1, self.counts, seconds, self.breaks, self.words, True)
        breaks = self.breaks + (1 if self.words and self.paused else 0)
        counts = self.counts + Words.of(part)
        return Size(chars, self.parts + 1, counts, self.pauses_s, breaks, True, False)

    def within(self, limits: SplitLimits, *, ssml: bool) -> bool:
        if self.chars + len(_render([], ssml=ssml)) > limits.max_chars:
            return False
        if self.breaks > limits.max_breaks:
            return False
        return self.counts.seconds(self.pauses_s) <= limits.max_speech_s


def measure(parts: list[str | Pause], *, ssml: bool) -> Size:
    size = Size()
    for part in parts:
        size = size.plus(part, ssml=ssml)
    return size


@dataclass
class _Packer:
    """Accumulates one segment at a time."""

    ssml: bool
    limits: SplitLimits
    pauses: Pauses
    segments: list[DocumentSegment] = field(default_factory=list)
    parts: list[str | Pause] = field(default_factory=list)
    size: Size = field(default_factory=Size)
    boundary: Boundary = "start"
    pause_before_s: float = 0.0

    def add(self, sentence: str, boundary: Boundary, pending: list[float]) -> None:
        """Place one sentence (or clause) that follows a boundary and any SSML pauses."""
        if not self.parts and not self.segments:  # the first words: leading pauses stay inside
            self._start([*(Pause(s) for s in pending), sentence])
            return
        seconds = pending or [self.pauses.at(boundary)]
        inner = [Pause(s) for s in seconds] if pending or boundary != "sentence" else []
        added: list[str | Pause] = [*inner, sentence]
        size = self.size
        for part in added:
            size = size.plus(part, ssml=self.ssml)
        if size.within(self.limits, ssml=self.ssml):
            self.parts.extend(added)
            self.size = size
            return
        self.close()
        if self.segments:  # else what closed had nothing to speak: this opens the document
            self.boundary, self.pause_before_s = boundary, sum(seconds)
        self._start([sentence])

    def trail(self, pending: list[float]) -> None:
        """SSML pauses after the last words: trailing silence of the last segment."""
        self._start([*self.parts, *(Pause(s) for s in pending)])

    def close(self) -> None:
        """End the segment; one with no letter or digit (a lone `...`, a rule, a line of
        emoji) is dropped: the engine would find nothing to speak and fail its job for good."""
        if not any(isinstance(p, str) and has_words(p) for p in self.parts):
            self._start([])
            return
        text, plain = _render(self.parts, ssml=self.ssml), _plain(self.parts)
        index = len(self.segments)
        self.segments.append(
            DocumentSegment(index, text, plain, self.pause_before_s, self.boundary)
        )
        self._start([])

    def _start(self, parts: list[str | Pause]) -> None:
        self.parts, self.size = parts, measure(parts, ssml=self.ssml)


def has_words(text: str) -> bool:
    """True when `text` holds a letter or digit (what the engine's normalisation speaks)."""
    return any(unicodedata.category(c)[0] in ("L", "N") for c in text)


def fits(parts: list[str | Pause], limits: SplitLimits, *, ssml: bool) -> bool:
    """Whether these parts, rendered, are within one segment's limits."""
    return measure(parts, ssml=ssml).within(limits, ssml=ssml)


def _render(parts: list[str | Pause], *, ssml: bool) -> str:
    body = " ".join(_render_part(part, ssml) for part in parts)
    return f"<speak>{body}</speak>" if ssml else body


def _render_part(part: str | Pause, ssml: bool) -> str:
    if isinstance(part, Pause):
        return f'<break time="{round(part.seconds * 1000)}ms"/>'
    return html.escape(part, quote=False) if ssml else part


def _plain(parts: list[str | Pause]) -> str:
    return " ".join(p for p in parts if isinstance(p, str))


def _units(sentence: str, limits: SplitLimits, ssml: bool) -> list[str]:
    """A sentence, or its clauses (then words) when it alone does not fit a segment."""
    if fits([sentence], limits, ssml=ssml):
        return [sentence]
    for breaker in (_CLAUSE_RE, _WORD_RE):
        parts = [p.strip() for p in breaker.split(sentence) if p.strip()]
        if len(parts) > 1:
            out = _joined(parts, limits, ssml)
            return [unit for part in out for unit in _units(part, limits, ssml)]
    return _cut(sentence, max(1, limits.max_chars // 2), limits, ssml)


def _cut(text: str, step: int, limits: SplitLimits, ssml: bool) -> list[str]:
    """One unbroken string cut between characters into chunks of `step`, a chunk that does not
    fit (its speech estimate: 500 Chinese or Thai characters are ~150 s) cut again at half the
    step: each chunk within the segment's limits, each character measured a few times."""
    chunks = [text[i : i + step] for i in range(0, len(text), step)]
    if step == 1:
        return chunks
    return [
        part
        for chunk in chunks
        for part in (
            [chunk] if fits([chunk], limits, ssml=ssml) else _cut(chunk, step // 2, limits, ssml)
        )
    ]


def _joined(parts: list[str], limits: SplitLimits, ssml: bool) -> list[str]:
    """Consecutive parts joined by spaces while the join fits one segment (each measured
    once: a join's size is its parts' sizes added)."""
    out: list[str] = []
    size = Size()
    for part in parts:
        own = Size().plus(part, ssml=ssml)
        joined = Size(size.chars + 1 + own.chars, 1, size.counts + own.counts)
        if out and joined.within(limits, ssml=ssml):
            out[-1], size = out[-1] + " " + part, joined
        else:
            out.append(part)
            size = own
    return out


def split_document(
    text: str, markup: Markup, limits: SplitLimits, pauses: Pauses
) -> list[DocumentSegment]:
    """The document's segments, in order; MarkupError for refused markup."""
    ssml = detect_markup(text, markup) == "ssml"
    packer = _Packer(ssml, limits, pauses)
    pending: list[float] = []
    previous: str | None = None
    for block in read_blocks(text, markup, max_break_s=limits.max_break_s):
        boundary: Boundary = "heading" if "heading" in (block.kind, previous) else "paragraph"
        previous = block.kind
        for part in block.parts:
            if isinstance(part, Pause):
                pending.append(part.seconds)
                continue
            for sentence in split_sentences(part):
                for unit in _units(sentence.strip(), limits, ssml):
                    if unit:
                        packer.add(unit, boundary, pending)
                        pending, boundary = [], "sentence"
    packer.trail(pending)
    packer.close()
    return packer.segments
