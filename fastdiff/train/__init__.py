"""Shared training: the accelerate loop (``fastdiff.train.loop``) and pipeline inputs (``fastdiff.train.inputs``)."""
