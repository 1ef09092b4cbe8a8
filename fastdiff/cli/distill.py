"""``fastdiff distill progressive|consistency|dmd|tiny-vae``: students that sample in 1-8 steps (dmd: one), and
tiny decoders for the ``tiny-vae`` accelerator.

Examples::

    fastdiff distill progressive TEACHER OUT --from 32 --to 1 --steps-per-round 1000
    fastdiff distill progressive digits-flow OUT --from 32 --to 4 --guidance 4 --pool 256   # a flow model
    fastdiff distill consistency TEACHER OUT --skip 20 --guidance-range 2
    fastdiff distill consistency TEACHER OUT --lora 16        # OUT: adapter for lcm-lora(path=OUT)
    fastdiff distill dmd TEACHER OUT --init PROG/steps-1 --guidance 2   # one step (DMD2)
    fastdiff distill tiny-vae digits-sd OUT --steps 2000                # tiny-vae(path=OUT)

Registered in ``fastdiff/cli/main.py`` (``COMMAND_MODULES``): ``fastdiff distill progressive ...``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastdiff.cli.args import FINITE, FRACTION, NON_NEGATIVE, POSITIVE, POSITIVE_FLOAT


def _teacher(args) -> Path:
    from fastdiff.cli.resolve import resolve_model

    return resolve_model(args.teacher, args.size)


def cmd_progressive(args) -> None:
    from fastdiff.distill.progressive import progressive

    report = progressive(
        _teacher(args),
        args.out,
        start=args.start,
        end=args.end,
        steps_per_round=args.steps_per_round,
        batch=args.batch,
        lr=args.lr,
        guidance=args.guidance,
        resume=args.resume,
        seed=args.seed,
        save_every=args.save_every,
        accumulate=args.accumulate,
        gradient_checkpointing=args.gradient_checkpointing,
        pool=args.pool,
    )
    print(json.dumps(report, indent=2, default=str))
    print(f"students in {args.out}/steps-N; load one with fastdiff.distill.common.load_student(DIR)")


def cmd_consistency(args) -> None:
    from fastdiff.distill.consistency import consistency

    report = consistency(
        _teacher(args),
        args.out,
        lora=args.lora,
        guidance_range=args.guidance_range,
        skip=args.skip,
        train_steps=args.train_steps,
        batch=args.batch,
        lr=args.lr,
        loss=args.loss,
        solver=args.solver,
        ema_decay=args.ema_decay,
        sample_steps=args.sample_steps,
        resume=args.resume,
        seed=args.seed,
        save_every=args.save_every,
        accumulate=args.accumulate,
        gradient_checkpointing=args.gradient_checkpointing,
    )
    print(json.dumps(report, indent=2, default=str))
    if args.lora:
        print(f"adapter in {args.out}; apply it with lcm-lora(path={Path(args.out).resolve()})")


def cmd_dmd(args) -> None:
    from fastdiff.distill.dmd import dmd

    report = dmd(
        _teacher(args),
        args.out,
        init=args.init,
        method=args.method_loss,
        guidance=args.guidance,
        train_steps=args.train_steps,
        batch=args.batch,
        lr=args.lr,
        fake_lr=args.fake_lr,
        fake_updates=args.fake_updates,
        fake_warmup=args.fake_warmup,
        t_range=args.t_range,
        regression=args.regression,
        pairs=args.pairs,
        pair_steps=args.pair_steps,
        ema_decay=args.ema_decay,
        resume=args.resume,
        seed=args.seed,
        save_every=args.save_every,
        snapshot_every=args.snapshot_every,
        selection_seeds=tuple(args.selection_seeds),
        report_seeds=tuple(args.report_seeds),
        pick_images=args.pick_images,
        lora=args.lora,
        gan=args.gan,
        gan_d=args.gan_d,
        gan_lr=args.gan_lr,
        gan_prompts=args.gan_prompts,
    )
    print(json.dumps(report, indent=2, default=str))
    print(f"student in {report['out']}; on its teacher: student(path={Path(report['out']).resolve()},steps=1)")


def cmd_tiny_vae(args) -> None:
    from fastdiff.distill.tiny_vae import tiny_vae

    report = tiny_vae(
        _teacher(args),
        args.out,
        steps=args.steps,
        batch=args.batch,
        channels=args.channels,
        blocks=args.blocks,
        lr=args.lr,
        seed=args.seed,
        resume=args.resume,
        save_every=args.save_every,
    )
    print(json.dumps(report, indent=2, default=str))
    print(f"tiny decoder in {args.out}; on its model: tiny-vae(path={Path(args.out).resolve()})")


def _pair(text: str) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'low,high' (two numbers), got {text!r}") from None
    return low, high


def _common(p, accumulate: bool = True) -> None:
    p.add_argument("teacher", help="pipeline directory (a UNet; progressive also a flow-matching model) or zoo name")
    p.add_argument("out", help="output directory (must not exist, unless --resume of the same command)")
    p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when TEACHER is a name")
    p.add_argument("--batch", type=POSITIVE, default=32)
    p.add_argument("--lr", type=POSITIVE_FLOAT, default=1e-4)
    p.add_argument("--seed", type=NON_NEGATIVE, default=0)
    p.add_argument("--save-every", type=POSITIVE, default=100, help="checkpoint every N steps")
    if accumulate:  # dmd's inner fake-score updates do not split into micro-batches
        p.add_argument("--accumulate", type=POSITIVE, default=1, help="gradient accumulation micro-batches")
        p.add_argument("--gradient-checkpointing", action="store_true")
    p.add_argument("--resume", action="store_true", help="continue an earlier run of this command in OUT")


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``distill progressive`` and ``distill consistency`` to the ``fastdiff`` subcommands."""
    distill = subparsers.add_parser("distill", help="train few-step students (progressive, consistency/LCM)")
    sub = distill.add_subparsers(dest="method", required=True)
    prog = sub.add_parser("progressive", help="halve DDIM steps per round (Salimans & Ho 2022)")
    _common(prog)
    prog.add_argument("--from", dest="start", type=POSITIVE, default=32, help="teacher's DDIM steps (power of two)")
    prog.add_argument("--to", dest="end", type=POSITIVE, default=1, help="last student's steps (power of two)")
    prog.add_argument("--steps-per-round", type=POSITIVE, default=1000, help="optimizer steps per halving")
    prog.add_argument(
        "--pool",
        type=POSITIVE,
        default=256,
        help="flow-matching teachers: how many of the teacher's own samples to train on",
    )
    prog.add_argument("--guidance", type=FINITE, default=None, help="guidance scale baked in (default 1: none)")
    prog.set_defaults(func=cmd_progressive)
    cons = sub.add_parser("consistency", help="latent consistency distillation (LCM), full or LoRA")
    _common(cons)
    cons.add_argument("--lora", type=int, default=None, metavar="RANK", help="train a LoRA of this rank")
    cons.add_argument("--guidance-range", default=None, help="'a,b' (w-embedding) or 'a' (baked in)")
    cons.add_argument("--skip", type=int, default=20, help="teacher's DDIM skipping step K (timesteps nK-1)")
    cons.add_argument("--train-steps", type=POSITIVE, default=1000)
    cons.add_argument(
        "--solver",
        default="ddim",
        choices=["ddim", "dpm"],
        help="teacher's skipping-step solver: DDIM or DPM-Solver++(2S) (two teacher calls)",
    )
    cons.add_argument("--loss", default="huber", choices=["huber", "l2"])
    cons.add_argument("--ema-decay", type=FRACTION, default=0.95)
    cons.add_argument("--sample-steps", type=POSITIVE, default=4, help="default LCM steps of the saved student")
    cons.set_defaults(func=cmd_consistency)
    dmd = sub.add_parser("dmd", help="one-step students by distribution matching (DMD2) or score identity (SiD)")
    _common(dmd, accumulate=False)
    dmd.set_defaults(lr=1e-5, func=cmd_dmd)
    dmd.add_argument(
        "--init",
        default=None,
        metavar="DIR",
        help="a one-step student to start from (needed unless the teacher predicts v)",
    )
    dmd.add_argument("--loss", dest="method_loss", default="dmd", choices=["dmd", "sid"])
    dmd.add_argument("--guidance", type=FINITE, default=None, help="teacher's guidance, baked in (default 1)")
    dmd.add_argument("--train-steps", type=POSITIVE, default=1000, help="generator updates")
    dmd.add_argument("--fake-lr", type=POSITIVE_FLOAT, default=2e-5)
    dmd.add_argument("--fake-updates", type=POSITIVE, default=5, help="fake-score updates per generator update")
    dmd.add_argument(
        "--fake-warmup", type=NON_NEGATIVE, default=0, help="fake-score updates before the generator starts to move"
    )
    dmd.add_argument("--t-range", type=_pair, default=(0.02, 0.98), help="noise levels of the matching loss")
    dmd.add_argument("--regression", type=FINITE, default=0.0, help="weight of the MSE to teacher ODE samples")
    dmd.add_argument("--pairs", type=POSITIVE, default=256, help="teacher ODE samples for --regression")
    dmd.add_argument("--pair-steps", type=POSITIVE, default=50, help="teacher DDIM steps per ODE sample")
    dmd.add_argument("--ema-decay", type=FRACTION, default=None)
    dmd.add_argument(
        "--snapshot-every",
        type=POSITIVE,
        default=None,
        help="keep the student every N updates; save the one picked on --selection-seeds",
    )
    dmd.add_argument("--selection-seeds", type=NON_NEGATIVE, nargs="+", default=[0])
    dmd.add_argument("--report-seeds", type=NON_NEGATIVE, nargs="+", default=[1])
    dmd.add_argument("--pick-images", type=POSITIVE, default=500, help="images per seed when picking")
    dmd.add_argument(
        "--gan",
        type=FINITE,
        default=0.0,
        metavar="W",
        help="DMD2's GAN term: W x the generator's adversarial loss (0: off; DMD2 uses 1e-3 to 5e-3)",
    )
    dmd.add_argument("--gan-d", type=FINITE, default=1e-2, metavar="W", help="weight of the head's real/fake loss")
    dmd.add_argument(
        "--gan-lr",
        type=POSITIVE_FLOAT,
        default=None,
        metavar="LR",
        help="the head's learning rate (default --fake-lr)",
    )
    dmd.add_argument(
        "--gan-prompts",
        action="store_true",
        help="flow teachers: the head reads each training image with a prompt naming its label (default: the "
        "empty prompt) and the generator's samples with their own prompts",
    )
    dmd.add_argument(
        "--lora",
        type=POSITIVE,
        default=None,
        metavar="RANK",
        help="generator and fake score as two LoRA adapters of this rank on the teacher's one copy "
        "of the weights (v or flow teachers)",
    )
    tiny = sub.add_parser("tiny-vae", help="a tiny decoder (AutoencoderTiny) distilled from the model's VAE")
    _common(tiny, accumulate=False)
    tiny.set_defaults(lr=1e-3, batch=64, save_every=200, func=cmd_tiny_vae)
    tiny.add_argument("--steps", type=POSITIVE, default=2000, help="optimizer steps")
    tiny.add_argument("--channels", type=POSITIVE, default=32, help="channels of every decoder level")
    tiny.add_argument("--blocks", type=POSITIVE, default=2, help="residual blocks per decoder level")
    return distill
