"""Benchmarks that print tables (`cosyq-worker bench ...`)."""

DEFAULT_TEXT = "The quick brown fox jumps over the lazy dog, and then it runs away."
