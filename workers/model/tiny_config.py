"""The tiny model's hyperparameters, written out as an upstream-format `cosyvoice2.yaml`.

The tiny model has the real architecture with small widths, so everything downstream (loading,
the pipeline, Core ML conversion, the queue) runs for real in a fraction of a second. The yaml
uses upstream's tags and `!ref`s so that our loader reads it through the same code path as a
real CosyVoice2-0.5B directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class TinySpec:
    """Sizes of the tiny model (the real model's value in each comment)."""

    llm_hidden: int = 64  # 896
    llm_layers: int = 2  # 24
    llm_heads: int = 4  # 14
    llm_kv_heads: int = 2  # 2
    llm_intermediate: int = 128  # 4864
    text_vocab: int = 1024  # 151936
    flow_width: int = 512  # 512 (upstream hard-codes it in several encoder parts)
    encoder_heads: int = 8  # 8
    encoder_linear_units: int = 64  # 2048
    encoder_blocks: int = 1  # 6
    estimator_channels: int = 64  # 256
    estimator_head_dim: int = 16  # 64
    estimator_heads: int = 4  # 8
    estimator_blocks: int = 2  # 4
    estimator_mid_blocks: int = 2  # 12
    hift_base_channels: int = 32  # 512
    hift_cond_channels: int = 32  # 512


def qwen2_config(spec: TinySpec) -> dict[str, Any]:
    """`CosyVoice-BlankEN/config.json` for the tiny backbone (HF Qwen2 keys)."""
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": spec.llm_hidden,
        "num_hidden_layers": spec.llm_layers,
        "num_attention_heads": spec.llm_heads,
        "num_key_value_heads": spec.llm_kv_heads,
        "intermediate_size": spec.llm_intermediate,
        "vocab_size": spec.text_vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "torch_dtype": "float32",
    }


_YAML_TEMPLATE = """\
# cosyq tiny model: the CosyVoice2-0.5B architecture with random weights and small widths.
# Written by `cosyq-worker model init-tiny`; read as plain data (nothing here is executed).
# spec: {spec}
__set_seed1: !apply:random.seed [1986]

sample_rate: 24000
llm_input_size: {llm_hidden}
llm_output_size: {llm_hidden}
spk_embed_dim: 192
qwen_pretrain_path: ''
token_frame_rate: 25
token_mel_ratio: 2

llm: !new:cosyvoice.llm.llm.Qwen2LM
    llm_input_size: !ref <llm_input_size>
    llm_output_size: !ref <llm_output_size>
    speech_token_size: 6561
    length_normalized_loss: True
    lsm_weight: 0
    mix_ratio: [5, 15]
    llm: !new:cosyvoice.llm.llm.Qwen2Encoder
        pretrain_path: !ref <qwen_pretrain_path>
    sampling: !name:cosyvoice.utils.common.ras_sampling
        top_p: 0.8
        top_k: 25
        win_size: 10
        tau_r: 0.1

flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: {flow_width}
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {flow_width}
        attention_heads: {encoder_heads}
        linear_units: {encoder_linear_units}
        num_blocks: {encoder_blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {flow_width}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: !ref <token_frame_rate>
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [{estimator_channels}]
            dropout: 0.0
            attention_head_dim: {estimator_head_dim}
            n_blocks: {estimator_blocks}
            num_mid_blocks: {estimator_mid_blocks}
            num_heads: {estimator_heads}
            act_fn: 'gelu'
            static_chunk_size: !ref <token_frame_rate> * <token_mel_ratio>
            num_decoding_left_chunks: -1

hift: !new:cosyvoice.hifigan.generator.HiFTGenerator
    in_channels: 80
    base_channels: {hift_base_channels}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor
        num_class: 1
        in_channels: 80
        cond_channels: {hift_cond_channels}

get_tokenizer: !name:cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer
    token_path: !ref <qwen_pretrain_path>
    skip_special_tokens: True
allowed_special: 'all'
feat_extractor: !name:matcha.utils.audio.mel_spectrogram
    n_fft: 1920
    num_mels: 80
    sampling_rate: !ref <sample_rate>
    hop_size: 480
    win_size: 1920
    fmin: 0
    fmax: 8000
    center: False
"""


def render_yaml(spec: TinySpec) -> str:
    """The tiny model's `cosyvoice2.yaml` text, in upstream's format."""
    values = asdict(spec)
    return _YAML_TEMPLATE.format(spec=json.dumps(values, separators=(",", ":")), **values)
