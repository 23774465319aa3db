"""Core ML backend: conversion (runs anywhere), compiled-model cache and runtime (macOS only).

Nothing in this package imports coremltools at import time; the modules that need it import it
inside the functions that run conversions or load packages, so a Linux worker never pays for it.
"""
