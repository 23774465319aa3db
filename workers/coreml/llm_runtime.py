"""The Core ML LLM behind the interface generation uses (`iter_speech_tokens`, `step_logps`).

`CoreMLQwen2LM` offers what `workers.model.llm.model._decode` touches on a `Qwen2LM`: `config`,
`device`, `prefix_embeddings`, `speech_embedding` and `step_logp(inputs_embeds, cache)`. The
embedding tables stay in PyTorch (a row lookup per token); the backbone and `llm_decoder` run in
the `llm` package, whose KV cache is a Core ML state. One state belongs to one request: it is
created on the request's first `step_logp` and kept on that request's `KVCache` object, whose
`length` still counts the positions (its own tensors stay unused), so nothing per-request lives
on this shared object. Log-softmax runs here in float32, as `Qwen2LM.step_logp` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor, nn

from shared.errors import InvalidRequestError
from workers.coreml.convert.llm_graph import causal_mask
from workers.model.llm.model import LLMConfig, Qwen2LM
from workers.model.llm.qwen2 import KVCache

EMBEDDING_KEYS = {  # checkpoint key -> attribute path on Qwen2LM
    "llm_embedding.weight": "llm_embedding",
    "llm.model.model.embed_tokens.weight": "llm.model.model.embed_tokens",
    "speech_embedding.weight": "speech_embedding",
}
STATE_ATTRIBUTE = "coreml_state"  # where a request's Core ML state rides on its KVCache


class StatefulPredictor(Protocol):
    """A loaded function of a stateful package (CompiledMLModel with function_name=...)."""

    def predict(self, data: dict[str, np.ndarray], state: Any = None) -> dict[str, np.ndarray]: ...

    def make_state(self) -> Any: ...


def embeddings_only(config: LLMConfig, state: Mapping[str, Tensor]) -> Qwen2LM:
    """A Qwen2LM on the meta device whose embedding tables are real (from `state`): three, or
    two for CosyVoice 3 (SOS and TASK_ID are rows of its `speech_embedding`)."""
    with torch.device("meta"):
        shell = Qwen2LM(config)
    for key, path in EMBEDDING_KEYS.items():
        if path == "llm_embedding" and config.sos_task_rows is not None:
            continue  # CosyVoice 3 has no llm_embedding
        parent_path, _, name = path.rpartition(".")
        parent = shell.get_submodule(parent_path) if parent_path else shell
        setattr(parent, name, nn.Embedding.from_pretrained(state[key].float(), freeze=True))
    return shell.eval()


class CoreMLQwen2LM:
    """Prefill and decode on Core ML; drop-in for `Qwen2LM` in speech-token generation."""

    def __init__(
        self,
        config: LLMConfig,
        embeddings: Qwen2LM,
        prefill: StatefulPredictor,
        decode: StatefulPredictor,
        *,
        capacity: int,
    ) -> None:
        self.config = config
        self._embeddings = embeddings
        self.prefill = prefill
        self.decode = decode
        self.capacity = capacity  # KV-cache positions the package was converted with
        self.device = torch.device("cpu")

    @property
    def speech_embedding(self) -> nn.Embedding:
        return self._embeddings.speech_embedding

    def prefix_embeddings(self, text: Tensor, prompt_text: Tensor, prompt_speech: Tensor) -> Tensor:
        """Same as `Qwen2LM.prefix_embeddings`: (1, 1 + P + L + 1 + S, hidden)."""
        return self._embeddings.prefix_embeddings(text, prompt_text, prompt_speech)

    def step_logp(self, inputs_embeds: Tensor, cache: KVCache) -> Tensor:
        """(1, T, hidden) new positions after `cache.length` -> float32 log-probs (V,).

        The package's capacity is checked against the positions actually used, not the
        cache's worst case (20x the text), which generation rarely reaches.
        """
        count = inputs_embeds.size(1)
        if cache.length + count > self.capacity:
            raise InvalidRequestError(
                f"LLM: {cache.length + count} positions (prompt + speech so far) exceed the Core "
                f"ML KV cache of {self.capacity}; shorten the text or convert with a larger "
                "--llm-capacity"
            )
        start = cache.reserve(count)
        state = getattr(cache, STATE_ATTRIBUTE, None)
        if state is None:
            state = self.decode.make_state()
            setattr(cache, STATE_ATTRIBUTE, state)
        function = self.decode if count == 1 else self.prefill
        data = {
            "inputs_embeds": np.ascontiguousarray(inputs_embeds.detach().float().cpu().numpy()),
            "causal_mask": causal_mask(start, count).numpy(),
        }
        logits = function.predict(data, state)["logits"]
        return torch.from_numpy(np.array(logits[0], dtype=np.float32)).log_softmax(dim=-1)
