"""Compression: token merging, low-rank factorization, pruning, quantization, fusion, compile, attention."""
