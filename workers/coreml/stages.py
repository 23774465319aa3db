"""What each converted package is: its file name and its input/output tensors (pure data).

Shapes use symbols for the flexible axes: N speech tokens (prompt + target), T mel frames
(T = 2N out of the encoder), L audio samples (L = 480·T), and B rows for a batched conversion
(`--batch-sizes`; its encoder then also takes each row's token count). Conversion builds the
Core ML inputs from these specs, the manifest records them, and the runtime calls packages by
these names.
"""

from __future__ import annotations

from dataclasses import dataclass

FLOW_ENCODER = "flow_encoder"
FLOW_CFM = "flow_cfm"
HIFT_SOURCE = "hift_source"
HIFT_DECODE = "hift_decode"
FLOW_STAGES = (FLOW_ENCODER, FLOW_CFM)
HIFT_STAGES = (HIFT_SOURCE, HIFT_DECODE)
ALL_STAGES = FLOW_STAGES + HIFT_STAGES

# Smallest lengths the graphs accept: HiFT reflect-pads by 1 frame and 8 samples.
MIN_TOKENS = 1
MIN_FRAMES = 2

BATCH = "B"  # the rows axis of a batched conversion (enumerated sizes, see `--batch-sizes`)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8)  # rows per call a conversion offers unless told otherwise
MAX_BATCH_SIZE = 16  # COSYQ_BATCH_SIZE's limit: no more rows can ever meet in one call
UNBATCHED = (1,)  # a package without a batch axis (and a manifest that names no sizes)

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: name, dtype ("float32" or "int32") and shape (symbols flexible)."""

    name: str
    dtype: str
    shape: tuple[Dim, ...]

    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(d for d in self.shape if isinstance(d, str))


@dataclass(frozen=True)
class StageSpec:
    """One package: `<name>.mlpackage` with these inputs and outputs."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    summary: str

    @property
    def package(self) -> str:
        return f"{self.name}.mlpackage"


def stage_specs(
    mel_bins: int, spk_embed_dim: int, harmonics: int, *, batched: bool = False
) -> dict[str, StageSpec]:
    """The four packages of the flow and HiFT stages for these model sizes.

    `batched`: the first axis is B rows instead of 1, and the encoder takes `lengths` (B,),
    each row's real token count (the rest of its row is padding, masked as in `flow_batch`).
    """
    f32, t = "float32", TensorSpec
    b: Dim = BATCH if batched else 1
    frames = 3 * mel_bins + 1  # see graphs.CFM_FRAME_PARTS
    lengths = (t("lengths", "int32", (b,)),) if batched else ()
    specs = (
        StageSpec(
            FLOW_ENCODER,
            (t("tokens", "int32", (b, "N")), *lengths, t("embedding", f32, (b, spk_embed_dim))),
            (t("mu", f32, (b, mel_bins, "T")), t("spks", f32, (b, mel_bins))),
            "speech tokens + speaker embedding -> mu (encoder, x2 upsampling) + speaker vector",
        ),
        StageSpec(
            FLOW_CFM,
            (t("frames", f32, (b, frames, "T")), t("spks", f32, (b, mel_bins))),
            (t("mel", f32, (b, mel_bins, "T")),),
            "10 Euler steps with classifier-free guidance; frames = [noise | mu | cond | mask]",
        ),
        StageSpec(
            HIFT_SOURCE,
            (t("mel", f32, (b, mel_bins, "T")), t("noise", f32, (b, harmonics, "L"))),
            (t("source", f32, (b, 1, "L")), t("f0", f32, (b, "T"))),
            "f0 predictor + frame-rate sine source (always float32)",
        ),
        StageSpec(
            HIFT_DECODE,
            (t("mel", f32, (b, mel_bins, "T")), t("source", f32, (b, 1, "L"))),
            (t("wav", f32, (b, "L")),),
            "vocoder network + DFT-basis inverse STFT",
        ),
    )  # fmt: skip
    return {spec.name: spec for spec in specs}


# The LLM: one multifunction package, two functions sharing weights and the KV-cache states.
LLM = "llm"
LLM_PREFILL = "prefill"  # T new positions (any length up to the capacity)
LLM_DECODE = "decode"  # exactly one new position: a fixed shape the Neural Engine can take
LLM_STATES = ("k_cache", "v_cache")
LLM_CHECKPOINT = "llm.pt"  # the conversion records its hash; the runtime reads its embeddings


def llm_specs(hidden: int, logits: int) -> dict[str, StageSpec]:
    """prefill/decode: inputs_embeds (1, T, hidden) and causal_mask (1, 1, T, E) -> logits."""
    f32, t = "float32", TensorSpec
    outputs = (t("logits", f32, (1, logits)),)
    return {
        LLM_PREFILL: StageSpec(
            LLM,
            (t("inputs_embeds", f32, (1, "T", hidden)), t("causal_mask", f32, (1, 1, "T", "E"))),
            outputs,
            "T new positions after E - T cached ones; keys/values written into the state",
        ),
        LLM_DECODE: StageSpec(
            LLM,
            (t("inputs_embeds", f32, (1, 1, hidden)), t("causal_mask", f32, (1, 1, 1, "E"))),
            outputs,
            "one new position after E - 1 cached ones",
        ),
    }
