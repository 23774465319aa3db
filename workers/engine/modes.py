"""What each mode puts in front of the TTS text for the LLM (upstream's input rules), per family.

CosyVoice 2:
- zero_shot: the prompt's transcript (normalised) as prompt text, and its speech tokens;
- cross_lingual: nothing (the LLM speaks the text in the voice's manner, any language);
- instruct2: the instruction (not normalised, ending in <|endofprompt|>) as prompt text and
  no prompt speech.
CosyVoice 3 needs <|endofprompt|> in every LLM input and skips normalisation for any string
that holds a `<|…|>` token, so:
- zero_shot: "You are a helpful assistant.<|endofprompt|>" + the transcript (not normalised)
  as prompt text, and the prompt's speech tokens;
- cross_lingual: no prompt text or speech; every piece's text starts with that system prompt
  (`text_prefix`, counted in the piece's length bounds as upstream counts it), and the text is
  neither normalised nor split into sentences (`raw_text`);
- instruct2: "You are a helpful assistant. <instruction><|endofprompt|>" as prompt text (the
  system sentence added unless the instruction starts with it), no prompt speech.
The flow always gets the voice's trimmed prompt tokens, mel and speaker embedding.

The prompt text goes into every piece's LLM input again, so its length is bounded in tokens
(COSYQ_MAX_PROMPT_TEXT_TOKENS): the speech bound counts only the TTS text, and a 2,000-character
instruction (emoji are several tokens each) made each piece's prefill thousands of positions
for a job estimated at a few seconds of speech, and sent each piece past a batch row (alone).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from shared.errors import InvalidRequestError
from shared.jobs import instruction_problem
from workers.engine.api import SynthesisInput
from workers.engine.text_frontend import TextFrontend, TextPiece

_NO_SPEECH = np.zeros(0, dtype=np.int32)
FAMILIES = ("cosyvoice2", "cosyvoice3")
SYSTEM_PROMPT = "You are a helpful assistant."  # CosyVoice 3's, before every <|endofprompt|>
# An instruction is a sentence or two (~10-40 tokens); a transcript of the longest prompt the
# speech tokenizer takes (30 s) ~100-200.
MAX_PROMPT_TEXT_TOKENS = 512


@dataclass(frozen=True)
class LLMPrompt:
    """The LLM's prompt for every piece of one request."""

    text_ids: list[int]
    speech_tokens: np.ndarray  # (n,) int32
    text_prefix: tuple[int, ...] = ()  # ids every piece's text starts with (CosyVoice 3 xl)


def raw_text(family: str, mode: str) -> bool:
    """Whether the mode's TTS text goes to the tokenizer as written (not normalised, not
    split): CosyVoice 3's cross_lingual, whose text carries the <|endofprompt|> prefix."""
    return family == "cosyvoice3" and mode == "cross_lingual"


def with_text_prefix(pieces: list[TextPiece], prompt: LLMPrompt) -> list[TextPiece]:
    """The pieces with the prompt's `text_prefix` in front of each one's ids (its text, what
    captions show, stays the user's)."""
    if not prompt.text_prefix:
        return pieces
    return [dataclasses.replace(p, ids=prompt.text_prefix + p.ids) for p in pieces]


def llm_prompt(
    frontend: TextFrontend,
    request: SynthesisInput,
    family: str = "cosyvoice2",
    limit: int = MAX_PROMPT_TEXT_TOKENS,
) -> LLMPrompt:
    """The mode's LLM prompt; InvalidRequestError for a combination the mode cannot use, or a
    prompt text over `limit` tokens."""
    prompt = _mode_prompt(frontend, request, family)
    if len(prompt.text_ids) > limit:
        field = "instruction" if request.mode == "instruct2" else "prompt_text"
        raise InvalidRequestError(
            f"{field}: {len(prompt.text_ids):,} tokens, limit {limit} (every piece of the text "
            "repeats it to the model; COSYQ_MAX_PROMPT_TEXT_TOKENS)"
        )
    return prompt


def check_voice_transcript(
    frontend: TextFrontend, transcript: str, family: str, limit: int = MAX_PROMPT_TEXT_TOKENS
) -> None:
    """Refuse, when a voice is added, a transcript over `limit` tokens as zero_shot gives it to
    the model: such a voice would fail every zero_shot job that names it."""
    if not transcript:
        return
    if family == "cosyvoice3":
        ids = frontend.instruction_ids(SYSTEM_PROMPT) + frontend.raw_prompt_text_ids(transcript)
    else:
        ids = frontend.prompt_text_ids(transcript)
    if len(ids) > limit:
        raise InvalidRequestError(
            f"transcript: {len(ids):,} tokens, limit {limit} (every piece of a zero_shot job "
            "repeats it to the model; COSYQ_MAX_PROMPT_TEXT_TOKENS)"
        )


def _mode_prompt(frontend: TextFrontend, request: SynthesisInput, family: str) -> LLMPrompt:
    mode, instruction = request.mode, request.instruction
    if (problem := instruction_problem(mode, instruction)) is not None:
        raise InvalidRequestError(problem)
    if mode == "zero_shot" and not request.prompt.transcript:
        raise InvalidRequestError(
            "mode zero_shot: the voice has no transcript (give prompt_text, re-add the "
            "voice with --text, or use mode cross_lingual)"
        )
    if family == "cosyvoice3":
        return _cosyvoice3_prompt(frontend, request)
    if mode == "zero_shot":
        return LLMPrompt(
            frontend.prompt_text_ids(request.prompt.transcript), request.prompt.speech_tokens
        )
    if mode == "cross_lingual":
        return LLMPrompt([], _NO_SPEECH)
    if mode == "instruct2" and instruction is not None:
        return LLMPrompt(frontend.instruction_ids(instruction), _NO_SPEECH)
    raise InvalidRequestError(f"mode: {mode!r} is not zero_shot, cross_lingual or instruct2")


def _cosyvoice3_prompt(frontend: TextFrontend, request: SynthesisInput) -> LLMPrompt:
    mode, instruction = request.mode, request.instruction
    system = frontend.instruction_ids(SYSTEM_PROMPT)  # ... assistant.<|endofprompt|>
    if mode == "zero_shot":
        transcript = frontend.raw_prompt_text_ids(request.prompt.transcript)
        return LLMPrompt(system + transcript, request.prompt.speech_tokens)
    if mode == "cross_lingual":
        return LLMPrompt([], _NO_SPEECH, text_prefix=tuple(system))
    if mode == "instruct2" and instruction is not None:
        return LLMPrompt(frontend.instruction_ids(system_instruction(instruction)), _NO_SPEECH)
    raise InvalidRequestError(f"mode: {mode!r} is not zero_shot, cross_lingual or instruct2")


def system_instruction(instruction: str) -> str:
    """CosyVoice 3's instruction: "You are a helpful assistant. " + the request's, unless it
    already starts with that sentence (the same job then runs on either family)."""
    text = instruction.strip()
    return text if text.startswith(SYSTEM_PROMPT) else f"{SYSTEM_PROMPT} {text}"
