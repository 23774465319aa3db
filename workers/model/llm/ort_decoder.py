"""The LLM's int8 step in ONNX Runtime: a `SpeechLM` whose backbone and head run in one graph.

`OrtSpeechLM` keeps our `Qwen2LM` for what is cheapest in PyTorch (the prefix's and the speech
tokens' embedding lookups) and runs every position through the `ort_graph` step graph. Each
request's KV cache lives in ONNX Runtime's memory for the whole request: one float32 buffer per
layer for keys and one for values, (B, kv_heads, capacity, head_dim), bound by IO binding as
both the graph's past input and its present output, which GroupQueryAttention writes in place.
Nothing of the cache is copied per step; a step binds only the new embeddings and the lengths.

The graph file is built once per checkpoint and precision and kept in a cache folder
(`ort_cache_path`), so a recycled worker opens it without rebuilding (building and quantizing
the full model takes about a minute).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from shared.errors import InvalidRequestError, ModelLoadError
from shared.logs import get_logger
from workers.model.llm.model import LLMConfig, Qwen2LM
from workers.model.llm.ort_graph import (
    DEFAULT_SCHEME,
    GRAPH_VERSION,
    GraphNames,
    QuantScheme,
    build_step_graph,
)
from workers.model.llm.qwen2 import KVCache

if TYPE_CHECKING:
    import onnxruntime as ort

log = get_logger(__name__)

STATE_ATTRIBUTE = "_ort_kv"  # where a request's ORT cache hangs on its `KVCache`
PRECISION = "int8"


def ort_cache_path(
    cache_dir: Path, checkpoint_hash: str, scheme: QuantScheme = DEFAULT_SCHEME
) -> Path:
    """The step graph's file for one checkpoint (its content hash), precision and scheme."""
    name = f"llm-step-{checkpoint_hash[:32]}-{PRECISION}{scheme.tag}-v{GRAPH_VERSION}.onnx"
    return cache_dir / name


@dataclass(frozen=True)
class SessionTuning:
    """ORT session options (the defaults are the shipped ones; the bench measures others).

    spinning: let the intra-op threads spin between steps (PyTorch samples and embeds on the
    same cores in between, and spinning there cost ~20x a step in the first try).
    optimization: "all", "extended", "basic" or "disabled" (ORT's graph optimisation level)."""

    spinning: bool = False
    optimization: str = "all"


DEFAULT_TUNING = SessionTuning()
_LEVELS = {
    "all": "ORT_ENABLE_ALL",
    "extended": "ORT_ENABLE_EXTENDED",
    "basic": "ORT_ENABLE_BASIC",
    "disabled": "ORT_DISABLE_ALL",
}


def _session_options(threads: int, tuning: SessionTuning = DEFAULT_TUNING) -> ort.SessionOptions:
    import onnxruntime as ort  # noqa: PLC0415 (only when this precision is chosen)

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, _LEVELS[tuning.optimization]
    )
    options.log_severity_level = 3
    spin = "1" if tuning.spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    return options


def write_step_graph(model: Qwen2LM, path: Path, scheme: QuantScheme = DEFAULT_SCHEME) -> None:
    """Build, quantize and write the graph (atomically: a reader never sees half a file)."""
    import onnx  # noqa: PLC0415

    graph = build_step_graph(model, scheme)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    onnx.save(graph, str(partial))
    os.replace(partial, path)


def open_step_session(
    model: Qwen2LM,
    path: Path,
    *,
    threads: int,
    scheme: QuantScheme = DEFAULT_SCHEME,
    tuning: SessionTuning = DEFAULT_TUNING,
) -> tuple[ort.InferenceSession, bool]:
    """The session for `path`, building the file first when it is missing; (session, built)."""
    import onnxruntime as ort  # noqa: PLC0415

    built = not path.is_file()
    if built:
        log.info("llm_graph_building", path=str(path), precision=PRECISION)
        write_step_graph(model, path, scheme)
    try:
        session = ort.InferenceSession(
            str(path),
            sess_options=_session_options(threads, tuning),
            providers=["CPUExecutionProvider"],
        )
    except Exception as e:  # onnxruntime raises its own exception types for bad files
        raise ModelLoadError(f"{path}: ONNX Runtime could not open the LLM step graph: {e}") from e
    return session, built


@dataclass
class OrtKV:
    """One request's (or one batch's) KV buffers in ORT memory, bound once to a binding."""

    keys: list[np.ndarray]
    values: list[np.ndarray]
    binding: Any  # onnxruntime.IOBinding, with every past/present buffer bound

    @property
    def capacity(self) -> int:
        return int(self.keys[0].shape[2])


class OrtSpeechLM:
    """`SpeechLM` with the backbone and head in ONNX Runtime (see the module docstring)."""

    def __init__(self, model: Qwen2LM, session: ort.InferenceSession, *, path: Path) -> None:
        self.model = model  # the embeddings; its backbone is never run
        self.session = session
        self.path = path  # the graph file
        self.config: LLMConfig = model.config
        self.names = GraphNames(model.config.backbone.num_layers)

    precision = PRECISION  # what the bench's stage table names

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def step_bytes(self) -> int:
        """Bytes of weights one step reads: the graph's initializers (8-bit weights, their
        scales, biases, norms), the rotary tables excepted (a step reads one row of each)."""
        import onnx  # noqa: PLC0415

        graph = onnx.load(str(self.path), load_external_data=False).graph
        total = 0
        for init in graph.initializer:
            if init.name not in ("cos", "sin"):
                item = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
                total += int(np.prod(init.dims)) * item
        return total

    @property
    def speech_embedding(self) -> nn.Embedding:
        return self.model.speech_embedding

    def prefix_embeddings(
        self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech: torch.Tensor
    ) -> torch.Tensor:
        return self.model.prefix_embeddings(text, prompt_text, prompt_speech)

    def new_kv(self, batch: int, capacity: int) -> OrtKV:
        """Zeroed buffers for `batch` rows of `capacity` positions, bound past = present."""
        backbone = self.config.backbone
        shape = (batch, backbone.num_kv_heads, capacity, backbone.head_dim)
        layers = range(backbone.num_layers)
        keys = [np.zeros(shape, dtype=np.float32) for _ in layers]
        values = [np.zeros(shape, dtype=np.float32) for _ in layers]
        return self.bind_kv(keys, values)

    def bind_kv(self, keys: list[np.ndarray], values: list[np.ndarray]) -> OrtKV:
        """A binding over existing C-contiguous float32 buffers (B, kv_heads, capacity,
        head_dim), one per layer, e.g. the first rows of a batch's (`ort_batch`): ORT reads
        and writes that memory itself, no copy."""
        import onnxruntime as ort  # noqa: PLC0415 (only when this precision is chosen)

        binding = self.session.io_binding()
        binding.bind_output("logp", "cpu")  # first: `get_outputs()[0]`
        pasts, presents = self.names.past(), self.names.present()
        for (pk, pv), (ok, ov), key, value in zip(pasts, presents, keys, values, strict=True):
            for past, present, buffer in ((pk, ok, key), (pv, ov, value)):
                if not buffer.flags.c_contiguous or buffer.dtype != np.float32:
                    raise ValueError("KV buffers must be C-contiguous float32")
                bound = ort.OrtValue.ortvalue_from_numpy(buffer)
                binding.bind_ortvalue_input(past, bound)
                binding.bind_ortvalue_output(present, bound)
        return OrtKV(keys=keys, values=values, binding=binding)

    def run_rows(self, kv: OrtKV, embeds: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """embeds (B, T, hidden) float32 after each row's `lengths` (B,) earlier positions ->
        log-probs (B, decoder_size). Every row takes the same T new positions."""
        t = embeds.shape[1]
        if int(lengths.max()) + t > kv.capacity:
            raise InvalidRequestError(
                f"KV cache full: {int(lengths.max())} + {t} positions > capacity {kv.capacity}"
            )
        ends = (lengths + t).astype(np.int32)
        kv.binding.bind_cpu_input("embeds", np.ascontiguousarray(embeds, dtype=np.float32))
        kv.binding.bind_cpu_input("seqlens_k", ends - 1)
        kv.binding.bind_cpu_input("total_sequence_length", np.array(ends.max(), dtype=np.int32))
        self.session.run_with_iobinding(kv.binding)
        return kv.binding.get_outputs()[0].numpy()[:, 0]

    def step_logp(self, inputs_embeds: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """(1, T, hidden) new positions after `cache.length` -> float32 log-probs (V,). The
        torch cache only counts positions; its keys and values stay unused."""
        kv = getattr(cache, STATE_ATTRIBUTE, None)
        if kv is None:
            kv = self.new_kv(1, cache.capacity)
            setattr(cache, STATE_ATTRIBUTE, kv)
        start = cache.reserve(inputs_embeds.shape[1])
        embeds = inputs_embeds.detach().float().cpu().numpy()
        logp = self.run_rows(kv, embeds, np.array([start], dtype=np.int32))
        return torch.from_numpy(logp[0].copy())


def load_ort_llm(
    model: Qwen2LM,
    *,
    cache_dir: Path,
    checkpoint_hash: str,
    threads: int,
    scheme: QuantScheme = DEFAULT_SCHEME,
    tuning: SessionTuning = DEFAULT_TUNING,
) -> OrtSpeechLM:
    """`model`'s int8 ORT stand-in, its graph from `cache_dir` (built there when missing)."""
    path = ort_cache_path(cache_dir, checkpoint_hash, scheme)
    session, built = open_step_session(model, path, threads=threads, scheme=scheme, tuning=tuning)
    log.info("llm_graph_opened", path=str(path), built=built, precision=PRECISION)
    return OrtSpeechLM(model, session, path=path)
