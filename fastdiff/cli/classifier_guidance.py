"""``fastdiff train-classifier MODEL OUT``: train the noise-aware classifier that ``classifier-guidance`` uses.

MODEL is a pipeline directory or a zoo name; its training data is ``MODEL/eval/split.npz`` (the digits
reference keeps its split there) or ``--data FILE.npz`` with ``x_train`` (N,C,H,W in [0, 1]) and ``y_train``
(and optionally ``x_test``/``y_test`` for the accuracy-by-noise-level report). The images are noised with
MODEL's own scheduler. OUT receives the classifier; ``OUT.json`` its training report.

Example::

    from fastdiff.cli.main import main
    main(["train-classifier", "/tmp/digits", "/tmp/digits/noisy_classifier.pt", "--steps", "3000"])
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastdiff.cli.args import NON_NEGATIVE, POSITIVE, POSITIVE_FLOAT


def cmd_train_classifier(args) -> Path:
    """Train and save; returns OUT. Errors (no data, wrong shapes) are ValueError/FileNotFoundError."""
    import numpy as np
    import torch
    from diffusers import DDPMScheduler

    from fastdiff.cli.resolve import resolve_model
    from fastdiff.core.models import DENOISER_ATTRS
    from fastdiff.guidance.noisy_classifier import save_noisy_classifier, train_noisy_classifier

    model = resolve_model(args.model, args.size)
    if not (model / "scheduler").is_dir():
        raise FileNotFoundError(f"{model} is not a pipeline directory (no scheduler/ in it)")
    data = Path(args.data) if args.data else model / "eval" / "split.npz"
    if not data.is_file():
        raise FileNotFoundError(
            f"no training data at {data}; pass --data FILE.npz with x_train (N,C,H,W in [0, 1]) and y_train"
        )
    with np.load(data) as split:
        if "x_train" not in split or "y_train" not in split:
            raise ValueError(f"{data} needs arrays x_train and y_train, has {sorted(split.files)}")
        arrays = {k: split[k] for k in ("x_train", "y_train", "x_test", "y_test") if k in split}
    for attr in DENOISER_ATTRS:  # the classifier must see what the denoiser sees
        config_path = model / attr / "config.json"
        if config_path.is_file():
            channels = json.loads(config_path.read_text()).get("in_channels")
            if channels is not None and arrays["x_train"].shape[1] != channels:
                raise ValueError(
                    f"{data} holds {arrays['x_train'].shape[1]}-channel images, the {attr} takes {channels}"
                )
    if args.threads:
        torch.set_num_threads(args.threads)
    scheduler_config = DDPMScheduler.load_config(model, subfolder="scheduler")
    classifier, report = train_noisy_classifier(
        arrays["x_train"],
        arrays["y_train"],
        scheduler_config,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
        widths=tuple(args.widths),
        x_test=arrays.get("x_test"),
        y_test=arrays.get("y_test"),
    )
    report.update(model=str(model), data=str(data), threads=torch.get_num_threads())
    out = save_noisy_classifier(classifier, args.out, report)
    out.with_name(out.name + ".json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print(f"noise-aware classifier in {out}; use it with classifier-guidance(path={out},scale=...)")
    return out


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``train-classifier`` to the ``fastdiff`` subcommands."""
    p = subparsers.add_parser("train-classifier", help="train a noise-aware classifier for classifier-guidance")
    p.add_argument("model", help="pipeline directory or zoo name (built into the cache)")
    p.add_argument("out", help="classifier file to write (its report goes to OUT.json)")
    p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when MODEL is a name")
    p.add_argument("--data", help="npz with x_train/y_train (default: MODEL/eval/split.npz)")
    p.add_argument("--steps", type=POSITIVE, default=3000, help="optimizer steps (default 3000)")
    p.add_argument("--batch-size", type=POSITIVE, default=128)
    p.add_argument("--lr", type=POSITIVE_FLOAT, default=2e-3)
    p.add_argument("--widths", type=POSITIVE, nargs="+", default=[16, 32, 64], help="channels per resolution")
    p.add_argument("--seed", type=NON_NEGATIVE, default=0)
    p.add_argument("--threads", type=POSITIVE, default=None, help="torch threads")
    p.set_defaults(func=cmd_train_classifier)
    return p
