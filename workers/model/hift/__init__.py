"""HiFT: F0 predictor, sine source, generator layers and the iSTFT that make the waveform."""
