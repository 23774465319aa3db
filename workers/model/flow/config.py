"""Hyperparameters of CosyVoice 2's flow stage (`CausalMaskedDiffWithXvec`) as frozen dataclasses.

Three configs, one per sub-stage: the upsampling conformer encoder, the causal U-Net estimator
and the flow-matching solver; `FlowConfig` holds them plus the token/speaker sizes. The model
directory's `cosyvoice2.yaml`, read as plain data, builds it (`from_model_yaml`); its section
readers (`encoder_config`, `estimator_config`, `require`, `require_int`) are public so that
tools reading sections of the same upstream layout share them. Values that upstream hard-codes
in its classes rather than in the yaml (the 4 up-sampling blocks, 10 Euler steps, the noise
buffer) are the defaults here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import ModelLoadError

# Upstream's flow.inference hard-codes 10 Euler steps; the CFM draws its fixed noise buffer as
# seed-0 randn(1, 80, 50 * 300): 300 s of 50 Hz mel frames.
DEFAULT_EULER_STEPS = 10
NOISE_FRAMES = 50 * 300  # 15000
NOISE_SEED = 0


def require(section: Mapping[str, Any], key: str, where: str) -> Any:
    """`section[key]`, or a `ModelLoadError` naming the missing key and where it was expected."""
    if not isinstance(section, Mapping):
        raise ModelLoadError(f"{where}: expected a mapping, found {type(section).__name__}")
    if key not in section:
        raise ModelLoadError(f"{where}: missing key {key!r}")
    return section[key]


def require_int(section: Mapping[str, Any], key: str, where: str) -> int:
    """`section[key]` as an integer (booleans refused), or a `ModelLoadError` naming it."""
    value = require(section, key, where)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelLoadError(f"{where}.{key}: expected an integer, found {value!r}")
    return value


def _expect(section: Mapping[str, Any], key: str, allowed: Any, where: str) -> None:
    """Reject an architecture switch we do not implement (only when the key is present)."""
    if key in section and section[key] != allowed:
        raise ModelLoadError(
            f"{where}.{key}: {section[key]!r} is not supported (CosyVoice 2 uses {allowed!r})"
        )


@dataclass(frozen=True)
class FlowEncoderConfig:
    """UpsampleConformerEncoder: linear embed, look-ahead, conformer blocks, x2 upsample, blocks."""

    width: int = 512  # output_size; upstream forces input_size = output_size = 512
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    num_up_blocks: int = 4  # hard-coded upstream
    pre_lookahead_len: int = 3  # look-ahead tokens of the pre-lookahead conv (kernel len + 1)
    upsample_stride: int = 2  # token_mel_ratio: 25 Hz tokens -> 50 Hz mel frames
    static_chunk_size: int = 25  # tokens per streaming chunk (x stride after upsampling)
    layer_norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.width % self.attention_heads:
            raise ModelLoadError(
                f"flow encoder: width {self.width} not divisible by {self.attention_heads} heads"
            )

    @property
    def head_dim(self) -> int:
        return self.width // self.attention_heads


@dataclass(frozen=True)
class EstimatorConfig:
    """CausalConditionalDecoder: the U-Net that predicts the flow's velocity field."""

    in_channels: int = 320  # x, mu, speaker, cond: 4 x 80 mel bins stacked on channels
    out_channels: int = 80
    channels: int = 256  # one U-Net level (upstream's CausalConditionalDecoder allows no more)
    attention_head_dim: int = 64
    num_heads: int = 8
    n_blocks: int = 4  # transformer blocks per U-Net block
    num_mid_blocks: int = 12
    ff_mult: int = 4  # diffusers FeedForward default
    static_chunk_size: int = 50  # mel frames per streaming attention chunk
    layer_norm_eps: float = 1e-5
    # CPU attention makes its fp32 scores a block of queries at a time, at most this many MB
    # per block (`workers/model/cpu_attention.py`): not a model size, a memory bound
    attention_score_block_mb: int = 64

    @property
    def time_embed_dim(self) -> int:
        return 4 * self.channels


@dataclass(frozen=True)
class CfmConfig:
    """Conditional flow matching at inference: fixed noise, cosine schedule, Euler, CFG."""

    n_timesteps: int = DEFAULT_EULER_STEPS
    inference_cfg_rate: float = 0.7
    temperature: float = 1.0
    noise_frames: int = NOISE_FRAMES
    noise_seed: int = NOISE_SEED


@dataclass(frozen=True)
class FlowConfig:
    """Everything that sizes the flow stage; `mel_bins` is upstream's `output_size`."""

    vocab_size: int = 6561
    mel_bins: int = 80
    spk_embed_dim: int = 192
    encoder: FlowEncoderConfig = field(default_factory=FlowEncoderConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    cfm: CfmConfig = field(default_factory=CfmConfig)

    def __post_init__(self) -> None:
        expected = 4 * self.mel_bins
        if self.estimator.in_channels != expected:
            raise ModelLoadError(
                f"flow estimator: in_channels {self.estimator.in_channels} != 4 x mel bins "
                f"({expected}: x, mu, speaker, cond)"
            )
        if self.estimator.out_channels != self.mel_bins:
            raise ModelLoadError(
                f"flow estimator: out_channels {self.estimator.out_channels} != {self.mel_bins}"
            )

    @property
    def token_mel_ratio(self) -> int:
        return self.encoder.upsample_stride

    def with_steps(self, steps: int) -> FlowConfig:
        """The same flow solved in `steps` Euler steps (fewer: faster and coarser)."""
        if steps < 1:
            raise ValueError(f"flow steps must be >= 1, got {steps}")
        return dataclasses.replace(self, cfm=dataclasses.replace(self.cfm, n_timesteps=steps))

    @classmethod
    def from_model_yaml(cls, doc: Mapping[str, Any]) -> FlowConfig:
        """Build from `load_plain_yaml(cosyvoice2.yaml)`: the `flow` section and its children."""
        flow = require(doc, "flow", "cosyvoice2.yaml")
        where = "cosyvoice2.yaml:flow"
        decoder = require(flow, "decoder", where)
        params = require(decoder, "cfm_params", f"{where}.decoder")
        params = params.get("content", params)  # !new:omegaconf.DictConfig {content: {...}}
        _expect(params, "t_scheduler", "cosine", f"{where}.decoder.cfm_params")
        _expect(params, "solver", "euler", f"{where}.decoder.cfm_params")
        estimator = require(decoder, "estimator", f"{where}.decoder")
        return cls(
            vocab_size=require_int(flow, "vocab_size", where),
            mel_bins=require_int(flow, "output_size", where),
            spk_embed_dim=require_int(flow, "spk_embed_dim", where),
            encoder=encoder_config(flow, require(flow, "encoder", where), f"{where}.encoder"),
            estimator=estimator_config(estimator, f"{where}.decoder.estimator"),
            cfm=CfmConfig(
                inference_cfg_rate=float(
                    require(params, "inference_cfg_rate", f"{where}.decoder.cfm_params")
                )
            ),
        )


def encoder_config(
    flow: Mapping[str, Any], enc: Mapping[str, Any], where: str
) -> FlowEncoderConfig:
    """The encoder's sizes from upstream's `flow` section and its `encoder` child.

    Refuses a width that changes inside the encoder and any architecture switch other than
    CosyVoice 2's; `where` names the `encoder` section in errors.
    """
    width = require_int(enc, "output_size", where)
    for section, key, place in ((enc, "input_size", where), (flow, "input_size", "flow")):
        if key in section and section[key] != width:
            raise ModelLoadError(
                f"{place}.{key}: {section[key]} != encoder output_size {width} "
                "(the upsampling encoder keeps one width throughout)"
            )
    for key, allowed in (
        ("input_layer", "linear"),
        ("pos_enc_layer_type", "rel_pos_espnet"),
        ("selfattention_layer_type", "rel_selfattn"),
        ("normalize_before", True),
        ("macaron_style", False),
        ("use_cnn_module", False),
    ):
        _expect(enc, key, allowed, where)
    return FlowEncoderConfig(
        width=width,
        attention_heads=require_int(enc, "attention_heads", where),
        linear_units=require_int(enc, "linear_units", where),
        num_blocks=require_int(enc, "num_blocks", where),
        pre_lookahead_len=int(flow.get("pre_lookahead_len", 3)),
        upsample_stride=int(flow.get("token_mel_ratio", 2)),
        static_chunk_size=int(enc.get("static_chunk_size", 0)),  # upstream class default: 0
    )


def estimator_config(est: Mapping[str, Any], where: str) -> EstimatorConfig:
    """The U-Net's sizes from upstream's `decoder.estimator` section (one level, GELU only)."""
    channels = require(est, "channels", where)
    if not isinstance(channels, list | tuple) or len(channels) != 1:
        raise ModelLoadError(
            f"{where}.channels: {channels!r} is not supported; the causal estimator has exactly "
            "one U-Net level (upstream's CausalConditionalDecoder mis-handles more)"
        )
    _expect(est, "act_fn", "gelu", where)
    return EstimatorConfig(
        in_channels=require_int(est, "in_channels", where),
        out_channels=require_int(est, "out_channels", where),
        channels=int(channels[0]),
        attention_head_dim=require_int(est, "attention_head_dim", where),
        num_heads=require_int(est, "num_heads", where),
        n_blocks=require_int(est, "n_blocks", where),
        num_mid_blocks=require_int(est, "num_mid_blocks", where),
        static_chunk_size=int(est.get("static_chunk_size", 50)),
    )
