"""Captions from timed text: SRT (the `srt` library) and WebVTT (`webvtt-py`).

A job's result carries its pieces with start and end seconds; a document's manifest carries
every piece of every segment on the document's time line. Either becomes cues here; the
formatting of times and blocks is the libraries', never ours. A piece too long to read at once
is cut into several cues (`shared.caption_cues`). The cue text is ours to make safe
(`srt_text`, `vtt_text`): a piece's text is what a tenant wrote, and may hold "-->" (an arrow in
prose; webvtt-py refuses to write it), `<` and `&` (WebVTT's markup: `<c.x>`, `<v Name>`), or,
read raw (CosyVoice 3's cross_lingual), blank lines and a line like a cue's timing: in the file
as written, a new cue that a player would show.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from shared.caption_cues import cut_caption
from shared.results import PieceTiming

CaptionFormat = Literal["srt", "vtt"]
CAPTION_FORMATS: tuple[str, ...] = ("srt", "vtt")
CONTENT_TYPES = {"srt": "application/x-subrip", "vtt": "text/vtt"}


@dataclass(frozen=True)
class Cue:
    """One caption: text shown from `start_s` to `end_s`."""

    start_s: float
    end_s: float
    text: str


def _lines(text: str) -> list[str]:
    """The text's lines, each trimmed, blank ones dropped (a blank line ends a cue)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def srt_text(text: str) -> str:
    """A cue's text for SRT, which has no escapes: one line (a line of only a number, then one
    starting with a time, starts a cue for the `srt` library, a blank line for every player),
    and "-->" written "->"."""
    return " ".join(_lines(text)).replace("-->", "->")


def vtt_text(text: str) -> str:
    """A cue's text for WebVTT: `&`, `<` and `>` as its character references (so "-->" is
    "--&gt;" and shows as written), no blank line."""
    escaped = (
        line.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        for line in _lines(text)
    )
    return "\n".join(escaped)


def to_srt(cues: Iterable[Cue]) -> str:
    import srt  # noqa: PLC0415 (only when captions are asked for: not at each worker's start)

    subtitles = [
        srt.Subtitle(
            index=number,
            start=dt.timedelta(seconds=cue.start_s),
            end=dt.timedelta(seconds=cue.end_s),
            content=srt_text(cue.text),
        )
        for number, cue in enumerate(cues, start=1)
    ]
    return str(srt.compose(subtitles))


def to_vtt(cues: Iterable[Cue]) -> str:
    import webvtt  # noqa: PLC0415 (only when captions are asked for)

    vtt = webvtt.WebVTT()
    for cue in cues:
        caption = webvtt.Caption(_vtt_time(cue.start_s), _vtt_time(cue.end_s), vtt_text(cue.text))
        vtt.captions.append(caption)
    return str(vtt.content)


def render(cues: Iterable[Cue], fmt: str) -> str:
    """Cues in `fmt` ("srt" or "vtt"); ValueError for any other."""
    if fmt == "srt":
        return to_srt(cues)
    if fmt == "vtt":
        return to_vtt(cues)
    raise ValueError(f"captions: {fmt!r} is not one of {', '.join(CAPTION_FORMATS)}")


def cues_from_pieces(pieces: Iterable[PieceTiming], offset_s: float = 0.0) -> list[Cue]:
    """A job's pieces as cues, shifted by `offset_s` (a segment's start in its document); a
    piece longer than a cue holds (`caption_cues`: 84 characters, 24 CJK) is cut into several,
    at sentence ends first, then clause marks (CJK punctuation among them)."""
    return [
        cue for p in pieces for cue in cut_cue(offset_s + p.start_s, offset_s + p.end_s, p.text)
    ]


def cut_cue(start_s: float, end_s: float, text: str) -> list[Cue]:
    """One stretch of timed text as the cues it is cut into (`caption_cues.cut_caption`)."""
    return [Cue(start, end, part) for start, end, part in cut_caption(text, start_s, end_s)]


def _vtt_time(seconds: float) -> str:
    """HH:MM:SS.mmm (SRT's timestamp with WebVTT's decimal point), the form Caption parses."""
    import srt  # noqa: PLC0415

    return str(srt.timedelta_to_srt_timestamp(dt.timedelta(seconds=seconds))).replace(",", ".")
