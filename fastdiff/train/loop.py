"""The training loop shared by pruning recovery and distillation: accelerate, exact resume, atomic checkpoints.

``train(model, loss_fn, steps, ...)`` runs ``steps`` optimizer steps of AdamW (cosine or constant learning
rate) on ``model``'s trainable parameters with ``accelerate.Accelerator`` (the GPU when there is one; bf16
autocast there when the GPU supports it, ``mixed_precision="auto"``). Each step averages ``accumulate``
micro-batches; micro-batch ``k`` of step ``i`` gets its own ``torch.Generator`` seeded from
``(seed, i, k)``, so the data order depends only on the seed and a resumed run replays exactly. Every
``save_every`` steps (and at the end) the model, optimizer, learning-rate schedule, loss history and the
``extra`` modules (e.g. an EMA target network) go to ``out_dir/<checkpoint>``: written to a temporary name,
then renamed, so a run killed at any moment leaves the previous or the next checkpoint, never half of one.
``resume=True`` continues from it. A tqdm bar shows the running loss; ``out_dir/loss.csv`` logs
every step (rows past the checkpoint are dropped on resume, so the log matches the weights).

Example::

    import torch
    from fastdiff.train.loop import train

    net = torch.nn.Linear(4, 1)
    x, y = torch.randn(64, 4), torch.randn(64, 1)

    def loss_fn(model, g, device):
        i = torch.randint(0, 64, (8,), generator=g)
        return torch.nn.functional.mse_loss(model(x[i].to(device)), y[i].to(device))

    report = train(net, loss_fn, steps=20, lr=1e-2, out_dir="/tmp/run", save_every=5, progress=False)
"""

from __future__ import annotations

import csv
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CHECKPOINT = "checkpoint.pt"


class TrainingDiverged(RuntimeError):
    """A loss went non-finite (or above ``max_loss``); the last good checkpoint is kept as it was."""


def mixed_precision_for(device: torch.device, wanted: str = "auto") -> str:
    """accelerate's ``mixed_precision`` for ``wanted`` ("auto": bf16 on a GPU that has it, else full fp32)."""
    if wanted != "auto":
        return wanted
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return "bf16"
    return "no"  # CPU autocast is slower than fp32 for these small convolutions


def atomic_save(path: Path, state: dict) -> None:
    """``torch.save`` to a temporary name, then rename: readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def ema_updater(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> Callable[[int], None]:
    """An ``after_step`` that moves ``ema``'s parameters toward ``model``'s, with diffusers ``EMAModel``'s warm-up
    (the decay at step ``s`` is ``min(decay, (1 + s) / (10 + s))``)."""

    def update(step: int) -> None:
        rate = min(decay, (1 + step) / (10 + step))
        with torch.no_grad():
            for target, source in zip(ema.parameters(), model.parameters()):
                target.lerp_(source.detach(), 1 - rate)

    return update


def step_generator(seed: int, step: int, micro: int = 0, accumulate: int = 1) -> torch.Generator:
    """The generator of micro-batch ``micro`` of step ``step``: the data order depends only on the seed."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step * accumulate + micro)


def train(
    model: torch.nn.Module,
    loss_fn: Callable[[torch.nn.Module, torch.Generator, torch.device], torch.Tensor],
    steps: int,
    *,
    lr: float = 1e-4,
    out_dir: str | os.PathLike | None = None,
    resume: bool = True,
    accumulate: int = 1,
    save_every: int = 50,
    seed: int = 0,
    progress: bool = True,
    stop_after: int | None = None,
    mixed_precision: str = "auto",
    gradient_checkpointing: bool = False,
    frozen: tuple[torch.nn.Module, ...] = (),
    extra: dict[str, torch.nn.Module] | None = None,
    state: dict[str, Any] | None = None,
    max_loss: float | None = None,
    after_step: Callable[[int], None] | None = None,
    schedule: str = "cosine",
    weight_decay: float = 0.0,
    max_grad_norm: float | None = None,
    checkpoint: str = CHECKPOINT,
    log_name: str = "loss.csv",
    desc: str = "train",
) -> dict:
    """Train ``model`` to minimise ``loss_fn(model, generator, device)``; return a report of the run.

    ``frozen`` modules (teachers) are moved to the device in eval mode; ``extra`` modules are moved too and
    checkpointed (``after_step(step)`` may update them, e.g. an EMA). ``state`` objects (a second model the loss
    trains with its own optimizer, and that optimizer) are checkpointed as they are, neither moved nor frozen.
    ``loss_fn`` may return ``(loss, {name: value})``: the values are shown beside the loss. A non-finite loss,
    or one above ``max_loss``, raises ``TrainingDiverged`` naming the step, before anything is saved. ``stop_after`` ends this call after that
    many steps (checkpointed): a time-boxed run that a later call with ``resume=True`` continues.
    """
    from accelerate import Accelerator
    from tqdm.auto import tqdm

    if steps < 0 or lr <= 0 or accumulate < 1 or save_every < 1:
        raise ValueError(
            f"train: need steps >= 0, lr > 0, accumulate >= 1, save_every >= 1; got {steps}, {lr}, {accumulate}, "
            f"{save_every}"
        )
    if schedule not in ("cosine", "constant"):
        raise ValueError(f"train: schedule must be cosine or constant, got {schedule!r}")
    guess = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # what Accelerator will pick
    accelerator = Accelerator(mixed_precision=mixed_precision_for(guess, mixed_precision))
    device = accelerator.device
    extra = dict(extra or {})
    for module in (*frozen, *extra.values()):
        module.to(device).eval().requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if schedule == "cosine":
        factor = lambda i: 0.5 * (1 + math.cos(math.pi * min(i / max(steps, 1), 1.0)))  # noqa: E731
    else:
        factor = lambda i: 1.0  # noqa: E731
    lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    prepared, optimizer, lr_schedule = accelerator.prepare(model, optimizer, lr_schedule)
    net = accelerator.unwrap_model(prepared)
    out = Path(out_dir) if out_dir is not None else None
    ckpt = out / checkpoint if out is not None else None
    log = out / log_name if out is not None else None
    start, losses = 0, []
    if ckpt is not None and resume and ckpt.is_file():
        saved = torch.load(ckpt, map_location=device, weights_only=False)
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        lr_schedule.load_state_dict(saved["schedule"])
        for name, module in extra.items():
            module.load_state_dict(saved["extra"][name])
        for name, obj in (state or {}).items():
            obj.load_state_dict(saved["state"][name])
        if accelerator.scaler is not None and "scaler" in saved:
            accelerator.scaler.load_state_dict(saved["scaler"])
        start, losses = saved["step"], saved["losses"]
    if log is not None:
        _reset_log(log, start)
    checkpointing = gradient_checkpointing and getattr(net, "_supports_gradient_checkpointing", False)
    if checkpointing:
        net.enable_gradient_checkpointing()
    # Eval mode while training: teachers run in eval mode, and train-mode extras (dropout, DiT's label dropout)
    # draw from the global RNG, which would break exact resume.
    net.eval()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    end = steps if stop_after is None else min(steps, start + stop_after)
    bar = tqdm(range(start, end), desc=desc, unit="step", disable=not progress, initial=start, total=steps)
    running = None
    try:
        for step in bar:
            total, shown = 0.0, {}
            for micro in range(accumulate):
                g = step_generator(seed, step, micro, accumulate)
                with accelerator.autocast():
                    loss = loss_fn(net, g, device)
                    loss, shown = loss if isinstance(loss, tuple) else (loss, shown)
                    loss = loss / accumulate
                accelerator.backward(loss)
                total += loss.item()
            if not math.isfinite(total) or (max_loss is not None and total > max_loss):
                kept = f"{ckpt} (step {_saved_step(ckpt)})" if ckpt is not None and ckpt.is_file() else "none"
                raise TrainingDiverged(
                    f"{desc}: loss {total:.4g} at step {step + 1} (limit: finite"
                    f"{'' if max_loss is None else f', <= {max_loss:g}'}); last good checkpoint: "
                    f"{kept}"
                )
            if max_grad_norm is not None:
                accelerator.clip_grad_norm_(params, max_grad_norm)
            optimizer.step()
            lr_schedule.step()
            optimizer.zero_grad(set_to_none=True)
            if after_step is not None:
                after_step(step)
            losses.append(total)
            running = total if running is None else 0.9 * running + 0.1 * total
            bar.set_postfix(loss=f"{running:.4g}", **{k: f"{v:.4g}" for k, v in shown.items()})
            done = step + 1
            if log is not None:
                with log.open("a", newline="") as f:
                    csv.writer(f).writerow(
                        [
                            done,
                            f"{total:.6g}",
                            f"{lr_schedule.get_last_lr()[0]:.6g}",
                            f"{time.perf_counter() - started:.3f}",
                        ]
                    )
            if ckpt is not None and (done % save_every == 0 or done == end):
                saved = {
                    "model": net.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "schedule": lr_schedule.state_dict(),
                    "step": done,
                    "losses": losses,
                    "extra": {k: m.state_dict() for k, m in extra.items()},
                    "state": {k: obj.state_dict() for k, obj in (state or {}).items()},
                }
                if accelerator.scaler is not None:
                    saved["scaler"] = accelerator.scaler.state_dict()
                atomic_save(ckpt, saved)
    finally:
        bar.close()
        if checkpointing:
            net.disable_gradient_checkpointing()
        net.eval()
    window = max(1, min(10, len(losses) // 4))
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else _rss_mib()
    return {
        "steps": end,
        "resumed_from": start,
        "device": str(device),
        "mixed_precision": accelerator.mixed_precision,
        "seconds": time.perf_counter() - started,
        "peak_memory_mib": round(peak, 1),
        "trainable_parameters": sum(p.numel() for p in params),
        "parameters": sum(p.numel() for p in net.parameters()),
        "loss_first": sum(losses[:window]) / window if losses else None,
        "loss_last": sum(losses[-window:]) / window if losses else None,
    }


def _reset_log(log: Path, start: int) -> None:
    # Keep the rows up to the checkpoint's step: a killed run may have logged steps it never saved.
    rows = []
    if start and log.is_file():
        with log.open(newline="") as f:
            rows = [r for r in csv.reader(f) if r and r[0].isdigit() and int(r[0]) <= start]
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "loss", "lr", "seconds"])
        writer.writerows(rows)


def _saved_step(ckpt: Path) -> int:
    return torch.load(ckpt, map_location="cpu", weights_only=False)["step"]


def _rss_mib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
