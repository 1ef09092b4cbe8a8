"""Several processes (devices) per pipeline call, on ``torch.distributed`` (gloo on CPU, nccl on GPU).

- ``parallel(mode=cfg,devices=2)``: the two classifier-free-guidance branches run on two ranks at once (cfg.py).
- ``parallel(mode=async,devices=N)``: the denoiser in N stages computing at once on stale activations (AsyncDiff,
  async_.py); ``mode=cfg+async`` combines both (devices = 2 x stages, cfg_async.py).
- ``parallel(mode=ulysses|ring,devices=N)``: the token sequence split across N ranks through diffusers' context
  parallelism (sequence.py); ``mode=cfg+ulysses`` splits each guidance branch's tokens over its own ranks
  (devices = 2 x ranks per branch, cfg_ulysses.py). Each mode is a config class
  of its own under the spec name ``parallel``, picked by ``mode`` (group.py).
- ``fastdiff.parallel.launch.launch(fn, devices)``: start ``devices`` worker processes with a process group
  (what ``torchrun`` does), run ``fn(rank, ...)`` in each and return rank 0's result; a rank that dies or
  hangs ends the call with an error and no process is left behind.

``StagePipeline`` (text encoder, denoiser and VAE decoder on 2-3 processes, so that successive requests overlap)
is a throughput runtime built on ``launch``: ``fastdiff.serving.stages`` (docs/stages.md).
"""
