"""Tiny random-weight flow-matching transformer pipelines (Flux, Flux.2, SD3, Sana, PixArt-Sigma, Qwen-Image, Z-Image)."""
