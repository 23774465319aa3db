"""Hyperparameters of CosyVoice 3's flow stage (`CausalMaskedDiffWithDiT`) as frozen dataclasses.

`DiTConfig` sizes the DiT estimator, `DiTFlowConfig` the whole stage (token table, speaker
projection, pre-look-ahead layer, CFM). Values upstream hard-codes in its classes rather than
in the yaml (256 time features, 31-tap grouped position convs in 16 groups, rotary base 10000,
LayerNorm eps 1e-6) are the defaults here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.errors import ModelLoadError
from workers.model.flow.config import CfmConfig, require, require_int

FLOW_CLASS = "CausalMaskedDiffWithDiT"
ESTIMATOR_KEYS = ("dim", "depth", "heads", "dim_head", "ff_mult", "mel_dim", "mu_dim", "spk_dim")


@dataclass(frozen=True)
class DiTConfig:
    """The DiT estimator: adaLN-Zero transformer blocks over [x, cond, mu, spks] frames."""

    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    mel_dim: int = 80  # x and cond channels; also the output channels
    mu_dim: int = 80
    spk_dim: int = 80
    static_chunk_size: int = 50  # mel frames per streaming attention chunk
    time_freq_dim: int = 256  # sinusoidal time features before the MLP
    conv_pos_kernel: int = 31
    conv_pos_groups: int = 16
    rotary_base: float = 10000.0
    layer_norm_eps: float = 1e-6
    # CPU bf16 attention (`cpu_attention`): the most one block of scores may hold, as
    # CosyVoice 2's `EstimatorConfig.attention_score_block_mb`
    attention_score_block_mb: int = 64
    # distinct t values whose adaLN modulations the CPU keeps (`dit/modulation.py`): 274 KB
    # each at full size in bf16; 0 computes them every call
    time_cache_values: int = 32

    def __post_init__(self) -> None:
        if self.dim % self.conv_pos_groups:
            raise ModelLoadError(
                f"DiT: dim {self.dim} not divisible by {self.conv_pos_groups} position-conv groups"
            )
        if self.dim_head % 2:
            raise ModelLoadError(f"DiT: dim_head {self.dim_head} must be even (rotary pairs)")

    @property
    def inner_dim(self) -> int:
        return self.heads * self.dim_head

    @property
    def in_channels(self) -> int:
        return 2 * self.mel_dim + self.mu_dim + self.spk_dim  # 320: x, cond, mu, spks


@dataclass(frozen=True)
class DiTFlowConfig:
    """Everything that sizes CosyVoice 3's flow stage; `mel_bins` is upstream's `output_size`."""

    vocab_size: int = 6561
    mel_bins: int = 80
    spk_embed_dim: int = 192
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    pre_lookahead_channels: int = 1024
    estimator: DiTConfig = field(default_factory=DiTConfig)
    cfm: CfmConfig = field(default_factory=CfmConfig)

    def __post_init__(self) -> None:
        est = self.estimator
        if (est.mel_dim, est.mu_dim, est.spk_dim) != (self.mel_bins,) * 3:
            raise ModelLoadError(
                f"DiT: mel_dim/mu_dim/spk_dim {est.mel_dim}/{est.mu_dim}/{est.spk_dim} must all "
                f"equal the flow's {self.mel_bins} mel bins (tokens are embedded into mel bins)"
            )

    @classmethod
    def from_model_yaml(cls, doc: Mapping[str, Any]) -> DiTFlowConfig:
        """Build from `load_plain_yaml(cosyvoice3.yaml)`: the `flow` section and its children."""
        where = "cosyvoice3.yaml:flow"
        flow = require(doc, "flow", "cosyvoice3.yaml")
        target = str(flow.get("_target", FLOW_CLASS))
        if not target.endswith(FLOW_CLASS):
            raise ModelLoadError(f"{where}: {target} is not CosyVoice 3's {FLOW_CLASS}")
        look = require(flow, "pre_lookahead_layer", where)
        decoder = require(flow, "decoder", where)
        params = require(decoder, "cfm_params", f"{where}.decoder")
        params = params.get("content", params)  # !new:omegaconf.DictConfig {content: {...}}
        est = require(decoder, "estimator", f"{where}.decoder")
        est_where = f"{where}.decoder.estimator"
        sizes = {key: require_int(est, key, est_where) for key in ESTIMATOR_KEYS}
        return cls(
            vocab_size=require_int(flow, "vocab_size", where),
            mel_bins=require_int(flow, "output_size", where),
            spk_embed_dim=require_int(flow, "spk_embed_dim", where),
            token_mel_ratio=require_int(flow, "token_mel_ratio", where),
            pre_lookahead_len=require_int(flow, "pre_lookahead_len", where),
            pre_lookahead_channels=require_int(look, "channels", f"{where}.pre_lookahead_layer"),
            estimator=DiTConfig(
                **sizes, static_chunk_size=require_int(est, "static_chunk_size", est_where)
            ),
            cfm=CfmConfig(
                inference_cfg_rate=float(
                    require(params, "inference_cfg_rate", f"{where}.decoder.cfm_params")
                )
            ),
        )
