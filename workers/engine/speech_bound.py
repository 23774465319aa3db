"""The worker's speech bound: a request's estimated speech, refused before any synthesis when
over `max_speech_seconds`.

The estimate is `shared.text_markup.SpeechCount`, the producer's code: Chinese, Japanese and
Korean characters per character (so a text of only those is estimated exactly as at submit),
the rest by the model's tokens, on each piece's text after normalisation. Only admission reads
it: the LLM's decode bounds per piece stay on the piece's real token ids (`length_bounds`).
"""

from __future__ import annotations

from collections.abc import Callable

from shared.errors import InvalidRequestError
from shared.text_markup import SpeechCount, speech_limit_message
from workers.engine.text_frontend import TextPiece


def piece_speech(piece: TextPiece, count_tokens: Callable[[str], int]) -> SpeechCount:
    """What one piece's speech estimate counts: its CJK characters per character, the tokens of
    the rest (the piece's own ids when it holds no CJK: no second tokenization)."""
    return SpeechCount.of(piece.text, count_tokens, whole_tokens=len(piece.ids))


def check_speech_bound(
    pieces: list[TextPiece],
    limit_s: float,
    count_tokens: Callable[[str], int],
    *,
    per_piece: bool = False,
) -> None:
    """Refuse, before any synthesis, a request whose speech estimate (after normalisation: CJK
    characters at their seconds each, the text tokens of the rest, plus pauses; `SpeechCount`,
    as the producer counts) is over `limit_s`: a runaway expansion would outlast the job
    timeout and be retried. `per_piece` (a document's segment): the text is split again, at
    the pieces the model's own count made, and each piece alone must be within `limit_s`."""
    if per_piece:
        for piece in pieces:
            check_speech_bound([piece], limit_s, count_tokens)
        return
    count = sum((piece_speech(piece, count_tokens) for piece in pieces), SpeechCount())
    pauses = sum(piece.pause_before_s or 0.0 for piece in pieces) + pieces[-1].pause_after_s
    estimate = count.seconds(pauses)
    if estimate > limit_s:
        other = "other " if count.cjk_characters else ""
        tokens = f"{count.tokens:,} {other}text tokens after normalisation"
        tokens = tokens if count.tokens or not count.cjk_characters else ""
        detail = count.describe(tokens, f"in {len(pieces)} pieces")
        if pauses:
            detail += f", {pauses:g} s of pauses"
        raise InvalidRequestError(f"text: {speech_limit_message(estimate, limit_s, detail)}")
