"""The LLM: our Qwen2 backbone, the speech-token LM on it, sampling, batched decoding."""
