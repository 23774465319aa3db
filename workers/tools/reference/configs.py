"""Each stage's model config from a reference set's `config.json` (`ReferenceSet.config`).

The file holds a `common` section and one section per size (`tiny`, `full`); every function
takes the parsed document and, where the stage has sizes, the size's name. A missing key or a
value the model cannot take raises `ModelLoadError` naming it. The model layer builds the same
configs from a model directory (`workers.model.loader.ModelConfigs.from_directory`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from shared.errors import ModelLoadError
from workers.model.causal_hift.config import CausalHiFTConfig
from workers.model.dit.config import DiTConfig, DiTFlowConfig
from workers.model.features import MelConfig, mel_config_from_fields
from workers.model.flow.config import (
    DEFAULT_EULER_STEPS,
    NOISE_FRAMES,
    NOISE_SEED,
    CfmConfig,
    FlowConfig,
    encoder_config,
    estimator_config,
    require,
    require_int,
)
from workers.model.hift.config import HiFTConfig, hift_config_from_fields
from workers.model.llm.cosyvoice3 import cosyvoice3_variant
from workers.model.llm.model import LLMConfig, build_llm_config

CV3_FLOW_CLASS = "CausalMaskedDiffWithDiT"


def reference_family(config: Mapping[str, Any]) -> str:
    """ "cosyvoice3" when the set's tiny flow is upstream's DiT flow, else "cosyvoice2"."""
    tiny = config.get("tiny", {})
    flow = tiny.get("flow", {}) if isinstance(tiny, Mapping) else {}
    cls = flow.get("cls", "") if isinstance(flow, Mapping) else ""
    return "cosyvoice3" if cls == CV3_FLOW_CLASS else "cosyvoice2"


def llm_config_from_reference(config: Mapping[str, Any], size: str) -> LLMConfig:
    """`<size>.llm` (with its `qwen2_config`) plus `common.llm_sampling`; checks the stop ids."""
    source = f"config.json[{size}][llm]"
    try:
        section = config[size]["llm"]
        common = config["common"]
        qwen = section["qwen2_config"]
        sizes = (section["llm_input_size"], section["llm_output_size"])
        speech_tokens = int(section["speech_token_size"])
        sampling_doc = common["llm_sampling"]
        special = common.get("llm_special_tokens", {})
    except KeyError as e:
        raise ModelLoadError(f"{source}: missing key {e.args[0]!r}") from e
    made = build_llm_config(qwen, sizes, speech_tokens, sampling_doc, source)
    expected_stops = special.get("stop_token_ids", list(made.stop_tokens))
    if list(expected_stops) != list(made.stop_tokens):
        raise ModelLoadError(f"{source}: stop ids {expected_stops} != {made.stop_tokens}")
    return made


def cosyvoice3_llm_config_from_reference(config: Mapping[str, Any], size: str) -> LLMConfig:
    """CosyVoice 3: `<size>.llm` as for CosyVoice 2, then `cosyvoice3_variant`; checks the
    decoder rows and the silent list against the set's."""
    source = f"config.json[{size}][llm]"
    try:
        section = config[size]["llm"]
        qwen = section["qwen2_config"]
        sizes = (section["llm_input_size"], section["llm_output_size"])
        speech_tokens = int(section["speech_token_size"])
        sampling_doc = config["common"]["llm_sampling"]
        silent = config["common"].get("silent_token_cap", {})
    except KeyError as e:
        raise ModelLoadError(f"{source}: missing key {e.args[0]!r}") from e
    made = cosyvoice3_variant(build_llm_config(qwen, sizes, speech_tokens, sampling_doc, source))
    rows = int(section.get("llm_decoder_out_features", made.decoder_size))
    if rows != made.decoder_size:
        raise ModelLoadError(f"{source}: llm_decoder_out_features {rows} != {made.decoder_size}")
    if list(silent.get("silent_tokens", made.silent_tokens)) != list(made.silent_tokens):
        raise ModelLoadError(f"{source}: silent tokens differ from {made.silent_tokens}")
    return made


def flow_config_from_reference(config: Mapping[str, Any], size: str) -> FlowConfig:
    """`<size>.flow` plus `common.flow_encoder_fixed` and `common.cfm` (upstream's constants)."""
    flow = require(require(config, size, "config.json"), "flow", f"config.json:{size}")
    common = require(config, "common", "config.json")
    fixed = common.get("flow_encoder_fixed", {})
    where = f"config.json:{size}.flow"
    encoder = encoder_config(flow, require(flow, "encoder", where), f"{where}.encoder")
    encoder = replace(
        encoder,
        num_up_blocks=int(fixed.get("num_up_blocks", encoder.num_up_blocks)),
        layer_norm_eps=float(fixed.get("layernorm_eps", encoder.layer_norm_eps)),
    )
    decoder = require(flow, "decoder", where)
    estimator = require(decoder, "estimator", f"{where}.decoder")
    return FlowConfig(
        vocab_size=require_int(flow, "vocab_size", where),
        mel_bins=require_int(flow, "output_size", where),
        spk_embed_dim=require_int(flow, "spk_embed_dim", where),
        encoder=encoder,
        estimator=estimator_config(estimator, f"{where}.decoder.estimator"),
        cfm=_cfm_from_reference(config),
    )


def _cfm_from_reference(config: Mapping[str, Any]) -> CfmConfig:
    """`common.cfm` (both families): steps, CFG rate, temperature and the noise buffer."""
    cfm = require(config, "common", "config.json").get("cfm", {})
    noise_shape = cfm.get("rand_noise_shape", [1, 80, NOISE_FRAMES])
    return CfmConfig(
        n_timesteps=int(cfm.get("n_timesteps", DEFAULT_EULER_STEPS)),
        inference_cfg_rate=float(cfm.get("inference_cfg_rate", 0.7)),
        temperature=float(cfm.get("temperature", 1.0)),
        noise_frames=int(noise_shape[-1]),
        noise_seed=int(cfm.get("rand_noise_seed", NOISE_SEED)),
    )


def dit_flow_config_from_reference(config: Mapping[str, Any], size: str) -> DiTFlowConfig:
    """CosyVoice 3: `<size>.flow` (pre-look-ahead layer, DiT estimator) plus `common.cfm`."""
    flow = require(require(config, size, "config.json"), "flow", f"config.json:{size}")
    where = f"config.json:{size}.flow"
    look = require(flow, "pre_lookahead_layer", where)
    est = require(require(flow, "decoder", where), "estimator", f"{where}.decoder")
    est_where = f"{where}.decoder.estimator"
    keys = ("dim", "depth", "heads", "dim_head", "ff_mult", "mel_dim", "mu_dim", "spk_dim")
    sizes = {key: require_int(est, key, est_where) for key in keys}
    estimator = DiTConfig(
        **sizes,
        static_chunk_size=require_int(est, "static_chunk_size", est_where),
        time_freq_dim=int(est.get("time_freq_embed_dim", 256)),
        conv_pos_kernel=int(est.get("conv_pos_kernel", 31)),
        conv_pos_groups=int(est.get("conv_pos_groups", 16)),
        rotary_base=float(est.get("rotary_base", 10000.0)),
    )
    return DiTFlowConfig(
        vocab_size=require_int(flow, "vocab_size", where),
        mel_bins=require_int(flow, "output_size", where),
        spk_embed_dim=require_int(flow, "spk_embed_dim", where),
        token_mel_ratio=int(flow.get("token_mel_ratio", 2)),
        pre_lookahead_len=require_int(flow, "pre_lookahead_len", where),
        pre_lookahead_channels=require_int(look, "channels", f"{where}.pre_lookahead_layer"),
        estimator=estimator,
        cfm=_cfm_from_reference(config),
    )


def hift_config_from_reference(config: Mapping[str, Any], size: str) -> HiFTConfig:
    """`common.hift_fixed` plus `<size>.hift`; `f0_predictor` is upstream's constructor as text."""
    try:
        fixed = config["common"]["hift_fixed"]
        sized = config[size]["hift"]
        predictor = _predictor_arguments(fixed.get("f0_predictor", ""))
        return hift_config_from_fields(
            fixed,
            base_channels=sized["base_channels"],
            f0_cond_channels=sized["f0_predictor_cond_channels"],
            f0_in_channels=predictor.get("in_channels", fixed["in_channels"]),
            f0_num_class=predictor.get("num_class", 1),
        )
    except KeyError as e:
        raise ModelLoadError(f"config.json: hift key missing: {e}") from e


def causal_hift_config_from_reference(config: Mapping[str, Any], size: str) -> CausalHiFTConfig:
    """CosyVoice 3: `common.hift_fixed` plus `<size>.hift` (with its `f0_predictor` mapping)."""
    try:
        fixed = config["common"]["hift_fixed"]
        sized = config[size]["hift"]
        predictor = sized["f0_predictor"]
        return CausalHiFTConfig.from_fields(
            fixed,
            base_channels=sized["base_channels"],
            f0_in_channels=predictor.get("in_channels", fixed["in_channels"]),
            f0_cond_channels=predictor["cond_channels"],
            f0_num_class=predictor.get("num_class", 1),
        )
    except (KeyError, TypeError) as e:
        raise ModelLoadError(f"config.json: hift key missing: {e}") from e


def mel_config_from_reference(config: Mapping[str, Any]) -> MelConfig:
    """`common.feat_extractor_mel`: the prompt mel is the same at every size."""
    try:
        return mel_config_from_fields(config["common"]["feat_extractor_mel"])
    except KeyError as e:
        raise ModelLoadError(f"config.json: feat_extractor_mel key missing: {e}") from e


def _predictor_arguments(text: str) -> dict[str, int]:
    """`ConvRNNF0Predictor(num_class=1, in_channels=80)` -> {"num_class": 1, "in_channels": 80}."""
    inside = text.partition("(")[2].rpartition(")")[0]
    values: dict[str, int] = {}
    for part in inside.split(","):
        name, _, value = part.partition("=")
        if value.strip().lstrip("-").isdigit():
            values[name.strip()] = int(value)
    return values
