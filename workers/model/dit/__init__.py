"""CosyVoice 3's flow stage (`CausalMaskedDiffWithDiT`): token embedding, pre-look-ahead convs,
x2 repetition and the DiT velocity estimator under CosyVoice 2's flow-matching solver."""
