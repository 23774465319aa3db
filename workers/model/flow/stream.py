"""Incremental streaming flow for one piece (`FlowStreamCache`): each hop computes only its frames.

`CausalMaskedDiffWithXvec.inference(streaming=True)` over all tokens so far gives, with static
chunk masks, mel frames that never change once the chunk they are in is full: attention reads
only keys before the end of the query's chunk (C = 25 tokens in the encoder, 50 frames after
its upsampling and in the estimator, counted from the start of the prompt), convolutions are
causal, norms are per position, and the noise is the fixed buffer indexed by absolute frame.
So a pass over new tokens needs, from the passes before it, only:
- the encoder's kept state (`EncoderStream`): its conformer layers' keys/values, the
  pre-look-ahead conv2 and upsampling conv's left context;
- per Euler step (10; CFG makes each call 2 rows) the estimator's (`EstimatorStream`): every
  causal conv's last 2 inputs and every attention layer's keys/values.
A pass keeps what it computed for positions before its last chunk edge; a chunk left partly
full (the first hop when the prompt is not a multiple of 25 tokens is lengthened so it is not,
but any hop works) is computed again by the next pass, which starts at that edge. Results
equal the whole-prefix recompute up to float rounding (tests bound it). A pass costs its own
frames' convs, projections and feed-forwards; only its attention scores grow with the prefix
(new queries x kept keys), a small share beside the rest for pieces of a few tens of seconds.

Memory grows with the piece and nothing else: the estimator's keys/values are
steps x 2 rows x 2 (k, v) x attention layers x heads*head_dim values per mel frame (full
model: 10 x 2 x 2 x 56 x 512 fp32 = 4.6 MB per frame, 0.23 GB per second of prompt + speech;
buffers grow by half, so up to 1.5x that, never past `max_bytes`: an allocation that would
raises `CacheFull` before it is made), the encoder's ~30 KB per frame; a piece's length
is bounded by its speech tokens (the LLM's maximum per piece) and the noise buffer (15000
frames). The cache is per request (per piece), never on the shared model; drop it after the
final pass.

The prompt's own positions before the last chunk edge that its look-ahead does not cross
(`voice_edge`) depend on the voice alone (prompt tokens, prompt mel, speaker embedding, the
fixed noise): `prime` computes them once, and `fork` gives each later request of the voice a
cache that starts there (`workers.engine.voice_prefixes` keeps them per voice).
"""

from __future__ import annotations

import copy
import math

import torch
from torch import Tensor

from shared.errors import InvalidRequestError
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.flow.stream_encoder import EncoderStream
from workers.model.flow.stream_estimator import EstimatorStream
from workers.model.flow.stream_layers import CacheBudget, Span


def keep_period(flow: CausalMaskedDiffWithXvec) -> int:
    """Tokens between positions on every chunk edge (encoder's and estimator's); 0: never
    (a chunk size 0 means full attention: nothing before the end is final)."""
    encoder, estimator = flow.config.encoder, flow.config.estimator
    ratio = flow.config.token_mel_ratio
    if encoder.static_chunk_size <= 0 or estimator.static_chunk_size <= 0:
        return 0
    per_frame_chunk = estimator.static_chunk_size // math.gcd(estimator.static_chunk_size, ratio)
    return math.lcm(encoder.static_chunk_size, per_frame_chunk)


class FlowStreamCache:
    """One piece's streaming flow: `advance(new tokens, finalize=...)` -> the new mel frames.

    prompt_token (1, P), prompt_feat (1, 2P, 80) and embedding (1, 192) as `inference` takes
    them. Each non-final call's last `pre_lookahead_len` tokens given so far are look-ahead
    context only (their frames come with a later call); the final call (finalize=True) gives
    the frames of every token left. The mel of all calls, concatenated, is
    `inference(all tokens, streaming=True)` when each non-final call ends on a chunk edge (as
    `PieceStream`'s hops do), and otherwise each call's frames are what `inference` over the
    tokens given so far (streaming=True, finalize=False) gives for them. With `max_bytes` the
    cache never holds more: a pass that would need more raises `CacheFull` (the cache is then
    unusable; drop it).
    """

    def __init__(
        self,
        flow: CausalMaskedDiffWithXvec,
        prompt_token: Tensor,
        prompt_feat: Tensor,
        embedding: Tensor,
        *,
        max_bytes: int | None = None,
    ) -> None:
        self.flow = flow
        self.ratio = flow.config.token_mel_ratio
        self.lookahead = flow.config.encoder.pre_lookahead_len
        self.period = keep_period(flow)
        self.prompt_token, self.prompt_feat, self.embedding = prompt_token, prompt_feat, embedding
        self.spks = flow.project_speaker(embedding)  # (1, 80)
        self.pending = prompt_token  # (1, m): tokens from `kept` on, not all final yet
        self.kept = 0  # tokens (prompt + target) whose states later passes reuse
        self.emitted = self.ratio * prompt_token.size(1)  # mel frames returned (prompt's too)
        self.budget = CacheBudget(max_bytes)
        self.encoder = EncoderStream(flow.encoder, self.budget)
        self.steps = [
            EstimatorStream(flow.decoder.estimator, self.budget)
            for _ in range(flow.config.cfm.n_timesteps)
        ]
        self.finished = False

    def voice_edge(self) -> int:
        """Tokens of the prompt whose states depend on the voice alone: the last chunk edge
        at or before P - look-ahead (0: none, or no chunk masks)."""
        if self.period == 0:
            return 0
        return max(0, (self.prompt_token.size(1) - self.lookahead) // self.period * self.period)

    def prime(self) -> int:
        """Compute the voice-only prefix (before any target token); returns its tokens."""
        edge = self.voice_edge()
        if edge == 0 or self.kept or self.pending.size(1) != self.prompt_token.size(1):
            return 0
        self._pass(Span(0, edge, edge), finalize=False)
        self.kept, self.pending = edge, self.pending[:, edge:]
        return edge

    def fork(self, *, max_bytes: int | None = None) -> FlowStreamCache:
        """A new request's cache going on from this one's kept positions (a primed prefix),
        under its own byte limit, which counts only what the fork adds: this one's keys and
        values are read where they are (never copied, never written)."""
        if self.finished:
            raise ValueError("flow stream: cannot fork a finished stream")
        forked = copy.copy(self)  # the prompt tensors and counters; `pending` is never mutated
        forked.budget = CacheBudget(max_bytes)
        forked.encoder = self.encoder.fork(forked.budget)
        forked.steps = [step.fork(forked.budget) for step in self.steps]
        return forked

    def advance(self, tokens: Tensor, *, finalize: bool) -> Tensor:
        """New target tokens (1, n) -> mel (1, 80, frames) float32 not returned before."""
        self._check(tokens, finalize)
        self.pending = torch.cat([self.pending, tokens.to(self.pending)], dim=1)
        total = self.kept + self.pending.size(1)
        out_end = total if finalize else total - self.lookahead
        self.finished = finalize
        if self.ratio * out_end <= self.emitted:
            return self.spks.new_zeros(1, self.flow.config.mel_bins, 0).float()
        span = Span(self.kept, out_end, self._keep_to(out_end, finalize) - self.kept)
        mel = self._pass(span, finalize)  # (1, 80, ratio * span.length)
        self.kept += span.keep
        self.pending = self.pending[:, span.keep :]
        new = mel[:, :, self.emitted - self.ratio * span.start :]
        self.emitted = self.ratio * out_end
        return new.float()

    def _keep_to(self, out_end: int, finalize: bool) -> int:
        """The last chunk edge at or before out_end (no later pass after the final one)."""
        if finalize or self.period == 0:
            return self.kept
        return max(self.kept, out_end // self.period * self.period)

    def _pass(self, span: Span, finalize: bool) -> Tensor:
        """Encoder, then the 10 Euler steps, over the span's tokens -> mel (1, 80, frames)."""
        flow = self.flow
        h = flow.embed_tokens(self.pending)  # (1, m, D)
        context = None if finalize else h[:, span.length : span.length + self.lookahead]
        mu = flow.encoder_proj(self.encoder(h[:, : span.length], context, span))  # (1, f, 80)
        frames = span.scaled(self.ratio)
        cond = self._condition(frames, like=mu)
        noise = flow.decoder.rand_noise[:, :, frames.start : frames.end]  # absolute frames
        noise = noise * flow.config.cfm.temperature
        for step in self.steps:
            step.span = frames
        return flow.decoder.solve(
            noise.to(mu.device, mu.dtype),
            mu.transpose(1, 2),
            mu.new_ones(1, 1, frames.length),
            self.spks,
            cond,
            streaming=True,
            step_estimators=self.steps,
        )

    def _condition(self, frames: Span, *, like: Tensor) -> Tensor:
        """(1, 80, f): the prompt mel where the span's frames overlap it, zeros after."""
        cond = like.new_zeros(1, frames.length, self.flow.config.mel_bins)
        prompt = self.prompt_feat[:, frames.start : frames.end].to(like)
        cond[:, : prompt.size(1)] = prompt
        return cond.transpose(1, 2)

    def _check(self, tokens: Tensor, finalize: bool) -> None:
        """Reject what `inference` would, before any compute; and calls after the final one."""
        if self.finished:
            raise InvalidRequestError("flow stream: a call after the final one")
        if tokens.numel() or not finalize:
            self.flow._check_inputs(tokens, self.prompt_token, self.prompt_feat, self.embedding)
        total = self.kept + self.pending.size(1) + tokens.size(1)
        frames = self.ratio * (total - (0 if finalize else self.lookahead))
        self.flow.decoder.check_frames(frames)

    @property
    def nbytes(self) -> int:
        """Bytes the cache holds (keys/values and conv tails of the encoder and every step)."""
        return self.encoder.cache.nbytes + sum(step.cache.nbytes for step in self.steps)
