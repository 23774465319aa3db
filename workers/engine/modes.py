"""What each mode puts in front of the TTS text for the LLM (upstream's input rules).

- zero_shot: the prompt's transcript (normalised) as prompt text, and its speech tokens;
- cross_lingual: nothing (the LLM speaks the text in the voice's manner, any language);
- instruct2: the instruction (not normalised, ending in <|endofprompt|>) as prompt text and
  no prompt speech.
The flow always gets the voice's trimmed prompt tokens, mel and speaker embedding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.errors import InvalidRequestError
from shared.jobs import instruction_problem
from workers.engine.api import SynthesisInput
from workers.engine.text_frontend import TextFrontend

_NO_SPEECH = np.zeros(0, dtype=np.int32)


@dataclass(frozen=True)
class LLMPrompt:
    """The LLM's prompt for every piece of one request."""

    text_ids: list[int]
    speech_tokens: np.ndarray  # (n,) int32


def llm_prompt(frontend: TextFrontend, request: SynthesisInput) -> LLMPrompt:
    """The mode's LLM prompt; InvalidRequestError for a combination the mode cannot use."""
    mode, instruction = request.mode, request.instruction
    if (problem := instruction_problem(mode, instruction)) is not None:
        raise InvalidRequestError(problem)
    if mode == "zero_shot":
        if not request.prompt.transcript:
            raise InvalidRequestError(
                "mode zero_shot: the voice has no transcript (give prompt_text, re-add the "
                "voice with --text, or use mode cross_lingual)"
            )
        return LLMPrompt(
            frontend.prompt_text_ids(request.prompt.transcript), request.prompt.speech_tokens
        )
    if mode == "cross_lingual":
        return LLMPrompt([], _NO_SPEECH)
    if mode == "instruct2" and instruction is not None:
        return LLMPrompt(frontend.instruction_ids(instruction), _NO_SPEECH)
    raise InvalidRequestError(f"mode: {mode!r} is not zero_shot, cross_lingual or instruct2")
