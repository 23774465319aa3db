"""CosyVoice 3's vocoder (`CausalHiFTGenerator` + `CausalConvRNNF0Predictor`): every conv causal,
a fixed uniform noise buffer in the source, `finalize` for streaming."""
