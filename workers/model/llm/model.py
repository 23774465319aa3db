"""CosyVoice 2's LLM stage (upstream `Qwen2LM`): text tokens + prompt speech -> speech tokens.

Parameter layout (official `llm.pt`): `llm_embedding` (row 0 = SOS, row 1 = TASK_ID),
`llm.model.model.*` (the Qwen2 backbone), `llm.model.lm_head` (tied, never computed),
`llm_decoder` (logits over speech ids, EOS and two more stop ids), `speech_embedding`.

Input layout (inference and teacher forcing alike), one embedding per position:
SOS, embed_tokens(prompt text + TTS text), TASK_ID, speech_embedding(prompt speech tokens),
then speech_embedding of each token generated (or, teacher-forced, each target token).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from torch import nn

from shared.errors import InvalidRequestError, ModelLoadError
from workers.model.checkpoint import load_strict
from workers.model.cpu_linear import Linear, llm_linear_kernel, set_linear_kernel
from workers.model.embedding import Embedding
from workers.model.llm.qwen2 import KVCache, Qwen2Config, Qwen2ForCausalLM, Qwen2Model
from workers.model.llm.sampling import SamplingConfig, ras_sampling

SOS_ROW = 0  # rows of llm_embedding
TASK_ID_ROW = 1
TIED_HEAD_KEY = "llm.model.lm_head.weight"  # the file's copy of embed_tokens: checked, not used
TEXT_TABLE_KEY = "llm.model.model.embed_tokens.weight"  # Qwen's text table: 136 M of 494 M
STOP_TOKEN_COUNT = 3  # speech_token_size + 0 (EOS), + 1, + 2 (FILL) all end generation

# How one piece's decoding ended: the model sampled a stop id, or it reached its length bound
# (a runaway: babble until 20x the text), or a forced length (benchmarks, warm-up) ended it.
StopKind = Literal["stop_token", "length_bound", "forced", "unknown"]


@dataclass
class DecodeOutcome:
    """Filled in by the decode loop when it ends (plain data the engine hands upward)."""

    stop: StopKind = "unknown"
    stop_token: int | None = None  # the sampled stop id (never yielded), when one ended it


def stop_kind(*, sampled_stop: bool, forced: bool) -> StopKind:
    """The one rule both decoders use to name how a piece ended."""
    if sampled_stop:
        return "stop_token"
    return "forced" if forced else "length_bound"


@dataclass(frozen=True)
class LLMConfig:
    """Sizes of Qwen2LM plus its sampling parameters.

    The defaults are CosyVoice 2's; `cosyvoice3_variant` sets CosyVoice 3's (`CosyVoice3LM`):
    200 extra rows, every one a stop id, EOS one past SOS, SOS/TASK_ID rows of
    `speech_embedding` (no `llm_embedding`), no decoder bias, <|endofprompt|> required, the
    minimum length masking index `speech_token_size` only (upstream's rule), a silent-run cap.
    """

    backbone: Qwen2Config
    speech_token_size: int
    sampling: SamplingConfig
    extra_tokens: int = STOP_TOKEN_COUNT  # rows past the speech ids; all of them stop ids
    eos_offset: int = 0  # EOS = speech_token_size + eos_offset
    decoder_bias: bool = True
    sos_task_rows: tuple[int, int] | None = None  # in speech_embedding; None: llm_embedding
    required_text_token: int | None = None  # must occur in prompt_text + text
    min_length_mask: tuple[int, ...] | None = None  # None: every stop id (CosyVoice 2 here)
    silent_tokens: tuple[int, ...] = ()  # capped runs of these (`cap_silent_runs`)
    max_silent_run: int = 0

    @property
    def eos_token(self) -> int:
        return self.speech_token_size + self.eos_offset

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return tuple(self.speech_token_size + i for i in range(self.extra_tokens))

    @property
    def decoder_size(self) -> int:
        return self.speech_token_size + self.extra_tokens

    @property
    def masked_below_min_length(self) -> list[int]:
        """Ids set to -inf while fewer than the minimum tokens were generated."""
        return list(self.stop_tokens if self.min_length_mask is None else self.min_length_mask)

    @classmethod
    def from_model_yaml(cls, doc: Mapping[str, Any], qwen_config: Mapping[str, Any]) -> LLMConfig:
        """From `load_plain_yaml(cosyvoice2.yaml)` and `CosyVoice-BlankEN/config.json`."""
        source = "cosyvoice2.yaml[llm]"
        llm = doc.get("llm")
        if not isinstance(llm, Mapping):
            raise ModelLoadError(f"{source}: missing mapping 'llm'")
        sampling_doc = llm.get("sampling", doc.get("sampling"))
        if not isinstance(sampling_doc, Mapping):
            raise ModelLoadError(f"{source}: missing mapping 'sampling'")
        try:
            sizes = (llm["llm_input_size"], llm["llm_output_size"])
            speech_tokens = int(llm["speech_token_size"])
        except KeyError as e:
            raise ModelLoadError(f"{source}: missing key {e.args[0]!r}") from e
        return build_llm_config(qwen_config, sizes, speech_tokens, sampling_doc, source)


def build_llm_config(
    qwen: Mapping[str, Any],
    sizes: tuple[Any, Any],
    speech_tokens: int,
    sampling_doc: Mapping[str, Any],
    source: str,
) -> LLMConfig:
    """Check an `LLMConfig`'s parts and build it.

    `qwen`: Hugging Face Qwen2 keys; `sizes`: `(llm_input_size, llm_output_size)`, both the
    backbone's width; `sampling_doc`: the sampling mapping. `source` names the section in a
    `ModelLoadError`.
    """
    backbone = Qwen2Config.from_hf_config(qwen, source=f"{source}: qwen2 config")
    if any(int(s) != backbone.hidden_size for s in sizes):
        raise ModelLoadError(
            f"{source}: llm_input_size/llm_output_size {sizes} must equal the Qwen2 "
            f"hidden_size {backbone.hidden_size} (embeddings feed the backbone directly)"
        )
    if speech_tokens < 1:
        raise ModelLoadError(f"{source}: speech_token_size must be >= 1")
    sampling = SamplingConfig.from_mapping(sampling_doc, source=f"{source}: sampling")
    return LLMConfig(backbone=backbone, speech_token_size=speech_tokens, sampling=sampling)


class Qwen2Encoder(nn.Module):
    """Upstream's wrapper level (`llm.model` = Qwen2ForCausalLM), kept for the key names."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.model = Qwen2ForCausalLM(config)


class Qwen2LM(nn.Module):
    """Parameters of the LLM stage plus the pieces generation and teacher forcing share."""

    def __init__(self, config: LLMConfig) -> None:
        super().__init__()
        hidden = config.backbone.hidden_size
        self.config = config
        if config.sos_task_rows is None:
            self.llm_embedding = Embedding(2, hidden)
        self.llm = Qwen2Encoder(config.backbone)
        self.llm_decoder = Linear(hidden, config.decoder_size, bias=config.decoder_bias)
        self.speech_embedding = Embedding(config.decoder_size, hidden)

    @property
    def backbone(self) -> Qwen2Model:
        return self.llm.model.model

    def prefix_embeddings(
        self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech: torch.Tensor
    ) -> torch.Tensor:
        """1-D id tensors -> (1, 1 + P + L + 1 + S, hidden): SOS, texts, TASK_ID, prompt speech."""
        sos_row, task_row = self.config.sos_task_rows or (SOS_ROW, TASK_ID_ROW)
        table = self.llm_embedding if self.config.sos_task_rows is None else self.speech_embedding
        rows = table.weight
        texts = self.backbone.embed_tokens(torch.cat((prompt_text, text)))
        parts = [rows[sos_row : sos_row + 1], texts, rows[task_row : task_row + 1]]
        if prompt_speech.numel():
            parts.append(self.speech_embedding(prompt_speech))
        return torch.cat(parts).unsqueeze(0)

    def step_logp(self, inputs_embeds: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Run (1, T, hidden) new positions through the cache -> float32 log-probs (V,) of the
        next token (only the last position is decoded)."""
        hidden = self.backbone(inputs_embeds, cache)
        return self.llm_decoder(hidden[0, -1]).float().log_softmax(dim=-1)

    @torch.inference_mode()
    def teacher_forced(
        self,
        text: torch.Tensor,
        prompt_text: torch.Tensor,
        prompt_speech: torch.Tensor,
        target_speech: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Prefix + target tokens in one causal pass -> (lm_input, hidden, logits).

        Shapes (1, N, hidden), (1, N, hidden), (1, N, decoder_size) with N = prefix + targets;
        logits row prefix-1+j predicts target j.
        """
        prefix = self.prefix_embeddings(
            _as_ids(text, "text", self.device),
            _as_ids(prompt_text, "prompt_text", self.device),
            _as_ids(prompt_speech, "prompt_speech", self.device),
        )
        targets = self.speech_embedding(_as_ids(target_speech, "target_speech", self.device))
        lm_input = torch.cat((prefix, targets.unsqueeze(0)), dim=1)
        hidden = self.backbone(lm_input, None)
        return lm_input, hidden, self.llm_decoder(hidden)

    @property
    def device(self) -> torch.device:
        return self.llm_decoder.weight.device


def _as_ids(tokens: torch.Tensor | Sequence[int], name: str, device: torch.device) -> torch.Tensor:
    """Token ids as a 1-D int64 tensor on `device`; accepts (L,) or (1, L)."""
    ids = torch.as_tensor(tokens).to(device=device, dtype=torch.long)
    if ids.dim() == 2 and ids.shape[0] == 1:
        ids = ids[0]
    if ids.dim() != 1:
        raise InvalidRequestError(f"{name}: expected token ids of shape (L,) or (1, L)")
    return ids


def _check_range(ids: torch.Tensor, name: str, limit: int) -> None:
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= limit):
        raise InvalidRequestError(f"{name}: token ids must be in [0, {limit})")


def build_llm(
    config: LLMConfig,
    state: Mapping[str, torch.Tensor],
    *,
    source: Path | str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    kernel: str | None = None,
    mapped_text_table: bool = False,
) -> Qwen2LM:
    """Build on meta, assign the checkpoint's tensors (no copy for fp32 cpu), eval mode.

    `lm_head.weight` must be in `state` (strict load) but is then re-aliased to embed_tokens;
    the file's copy is dropped (it is tied in official files and never used). `kernel` picks
    the Linear matmul ("torch", "onednn" or "gemv"); default: `llm_linear_kernel`.
    `mapped_text_table`: `state`'s text table (`TEXT_TABLE_KEY`) is a mapped fp32 tensor that
    stays as it is, its rows cast to `dtype` as they are looked up (see `MappedTableEmbedding`).
    """
    device = torch.device(device)
    with torch.device("meta"):
        model = Qwen2LM(config)
    load_strict(model, state, source=source, assign=True)
    text_table = model.backbone.embed_tokens.take_table() if mapped_text_table else None
    model.llm.model.tie_weights()  # before `to`: the file's own head copy is never converted
    model.to(device=device, dtype=dtype)
    if text_table is not None:
        model.backbone.embed_tokens.keep_mapped_table(text_table, dtype)
    model.llm.model.tie_weights()
    model.eval().requires_grad_(False)
    set_linear_kernel(model, kernel or llm_linear_kernel(device, dtype))
    return model


class SpeechLM(Protocol):
    """What speech-token decoding needs of an LLM: `Qwen2LM`, or the Core ML runtime's stand-in."""

    config: LLMConfig

    @property
    def device(self) -> torch.device: ...

    @property
    def speech_embedding(self) -> nn.Embedding: ...

    def prefix_embeddings(
        self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech: torch.Tensor
    ) -> torch.Tensor: ...

    def step_logp(self, inputs_embeds: torch.Tensor, cache: KVCache) -> torch.Tensor: ...


@dataclass(frozen=True)
class DecodePlan:
    """One piece's validated LLM inputs and its length rule (shared by the alone and the
    batched decoders, so both accept and reject exactly the same requests)."""

    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # text, prompt_text, prompt_speech
    bounds: tuple[int, int]  # (min, max) generated tokens
    masked: list[int]  # ids set to -inf before the minimum length
    forced: bool = False  # `forced_length` fixed the bounds (benchmarks, warm-up)

    def positions(self) -> int:
        """KV positions the piece needs: SOS, texts, TASK_ID, prompt speech, generated."""
        text, prompt_text, prompt_speech = self.inputs
        return 2 + text.numel() + prompt_text.numel() + prompt_speech.numel() + self.bounds[1]


def plan_decode(
    model: SpeechLM,
    text: torch.Tensor | Sequence[int],
    *,
    prompt_text: torch.Tensor | Sequence[int] = (),
    prompt_speech: torch.Tensor | Sequence[int] = (),
    sampling: SamplingConfig | None = None,
    forced_length: int | None = None,
) -> DecodePlan:
    """Validate one piece's ids (InvalidRequestError naming the field) and fix its bounds.

    Lengths: between 2x and 20x the TTS text tokens (sampling ratios). CosyVoice 2: every stop
    id is masked before the minimum: upstream masks EOS alone, so a fill token sampled first
    ends the piece with no speech at all (seen on random weights). CosyVoice 3 keeps upstream's
    rule (`min_length_mask`, parity with its reference set). `forced_length` (benchmarks):
    exactly that many, every stop id masked.
    """
    config = model.config
    sampling = sampling or config.sampling
    ids = [
        _as_ids(tokens, name, model.device)
        for tokens, name in ((text, "text"), (prompt_text, "prompt_text"))
    ]
    speech = _as_ids(prompt_speech, "prompt_speech", model.device)
    if ids[0].numel() == 0:
        raise InvalidRequestError("text: needs at least one token")
    for tokens, name in zip(ids, ("text", "prompt_text"), strict=True):
        _check_range(tokens, name, config.backbone.vocab_size)
    _check_range(speech, "prompt_speech", config.speech_token_size)
    required = config.required_text_token
    if required is not None and not any(bool((t == required).any()) for t in ids):
        raise InvalidRequestError(
            f"text: CosyVoice 3 needs the <|endofprompt|> token (id {required}) in the prompt "
            "text or the text (e.g. 'You are a helpful assistant.<|endofprompt|>' first)"
        )
    if forced_length is None:
        return DecodePlan(
            (ids[0], ids[1], speech),
            sampling.length_bounds(ids[0].numel()),
            config.masked_below_min_length,
        )
    if forced_length < 0:
        raise InvalidRequestError("forced_length: must be >= 0")
    return DecodePlan(  # every stop id masked: exactly that many (CosyVoice 3 masks one only)
        (ids[0], ids[1], speech),
        (forced_length, forced_length),
        list(config.stop_tokens),
        forced=True,
    )


def iter_speech_tokens(
    model: SpeechLM,
    text: torch.Tensor | Sequence[int],
    *,
    prompt_text: torch.Tensor | Sequence[int] = (),
    prompt_speech: torch.Tensor | Sequence[int] = (),
    generator: torch.Generator,
    sampling: SamplingConfig | None = None,
    forced_length: int | None = None,
    outcome: DecodeOutcome | None = None,
) -> Iterator[int]:
    """Validate now (`plan_decode`), then yield speech tokens one by one (a stop id ends
    generation, unyielded). `generator` (CPU) is the only source of randomness; `outcome`,
    when given, says how the loop ended once the iterator is exhausted."""
    sampling = sampling or model.config.sampling
    plan = plan_decode(
        model,
        text,
        prompt_text=prompt_text,
        prompt_speech=prompt_speech,
        sampling=sampling,
        forced_length=forced_length,
    )
    return _decode(
        model,
        plan=plan,
        sampling=sampling,
        generator=generator,
        outcome=outcome if outcome is not None else DecodeOutcome(),
    )


@torch.inference_mode()
def _decode(
    model: SpeechLM,
    *,
    plan: DecodePlan,
    sampling: SamplingConfig,
    generator: torch.Generator,
    outcome: DecodeOutcome,
) -> Iterator[int]:
    """Prefill (text, prompt_text, prompt_speech), then sample; the plan's `masked` ids are
    -inf before the minimum length. `outcome.stop` is set when the loop ends."""
    config = model.config
    prefix = model.prefix_embeddings(*plan.inputs)
    masked = plan.masked
    min_len, max_len = plan.bounds
    outcome.stop = stop_kind(sampled_stop=False, forced=plan.forced)
    cache = KVCache(
        config.backbone,
        prefix.shape[1] + max_len,
        device=prefix.device,
        dtype=prefix.dtype,
    )
    decoded: list[int] = []
    logp = model.step_logp(prefix, cache)
    for step in range(max_len):
        if step < min_len:
            logp[masked] = float("-inf")
        token = ras_sampling(logp, decoded, sampling, generator)
        if token in config.stop_tokens:
            outcome.stop = stop_kind(sampled_stop=True, forced=plan.forced)
            outcome.stop_token = token
            return
        yield token
        decoded.append(token)
        if step + 1 < max_len:
            embed = model.speech_embedding.weight[token].view(1, 1, -1)
            logp = model.step_logp(embed, cache)
