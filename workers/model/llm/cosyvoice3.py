"""CosyVoice 3's LLM (`CosyVoice3LM`) as a variant of `Qwen2LM`'s config, and its silent cap.

The same Qwen2 body, sampler and decoders; what differs is data (`cosyvoice3_variant`):
`speech_embedding` and `llm_decoder` have 200 rows past the 6561 speech ids, all of them stop
ids (SOS 6561, EOS 6562, TASK_ID 6563, FILL 6564, unused slots); SOS and TASK_ID are rows of
`speech_embedding` (there is no `llm_embedding`); the decoder has no bias; the text must hold
<|endofprompt|> (151646); while below the minimum length upstream masks index 6561 only (now
SOS, so EOS and the rest can end generation at any step).

`cap_silent_runs` is upstream's `CosyVoice3Model.llm_job` filter: tokens of the FSQ silent and
breath list are counted while they come in a row; from the 6th in a row on they are dropped
(the LLM still saw them) until another token resets the count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from workers.model.llm.model import LLMConfig

EXTRA_TOKENS = 200  # speech_token_size + 200 rows in speech_embedding and llm_decoder
SOS_OFFSET, EOS_OFFSET, TASK_ID_OFFSET = 0, 1, 2  # past speech_token_size
END_OF_PROMPT = 151646  # <|endofprompt|>, hard-coded upstream
SILENT_TOKENS = (1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323)
MAX_SILENT_RUN = 5


def cosyvoice3_variant(config: LLMConfig) -> LLMConfig:
    """CosyVoice 2's `LLMConfig` (same backbone, sizes and sampling) turned into CosyVoice 3's."""
    size = config.speech_token_size
    return replace(
        config,
        extra_tokens=EXTRA_TOKENS,
        eos_offset=EOS_OFFSET,
        decoder_bias=False,
        sos_task_rows=(size + SOS_OFFSET, size + TASK_ID_OFFSET),
        required_text_token=END_OF_PROMPT,
        min_length_mask=(size + SOS_OFFSET,),
        silent_tokens=SILENT_TOKENS,
        max_silent_run=MAX_SILENT_RUN,
    )


def cap_silent_runs(tokens: Iterable[int], config: LLMConfig) -> Iterator[int]:
    """`tokens` without the silent ones past `max_silent_run` in a row (none for CosyVoice 2)."""
    silent = frozenset(config.silent_tokens)
    run = 0
    for token in tokens:
        if token in silent:
            run += 1
            if run > config.max_silent_run:
                continue
        else:
            run = 0
        yield token
