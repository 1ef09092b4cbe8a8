"""The ``fastdiff`` command line: zoo, reference, bench, generate, profile, demo.

Examples::

    fastdiff zoo build tiny-sd /tmp/tiny-sd --size bench
    fastdiff bench /tmp/tiny-sd --config ddim50="scheduler(name=ddim,steps=50)" \\
        --config dpm20="scheduler(name=dpm++2m,steps=20)" --runs 3 --json out/bench.json
    fastdiff generate tiny-sd --accel "scheduler(name=unipc,steps=10)" --prompt "a fox" --out out/fox
    fastdiff profile tiny-sd --accel "scheduler(name=dpm++2m,steps=20)"
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path

import fastdiff
from fastdiff.cli.args import (
    FINITE,
    NON_NEGATIVE,
    NON_NEGATIVE_FLOAT,
    PATH_ERRORS,
    POSITIVE,
    POSITIVE_FLOAT,
    Parser,
    accel_specs,
    error_exit,
    named_specs,
)
from fastdiff.cli.resolve import cache_dir, parse_configs, resolve_model  # noqa: F401  (cache_dir: re-exported)


def cmd_zoo(args) -> None:
    from fastdiff import zoo

    if args.zoo_cmd == "list":
        print("\n".join(zoo.available()))
        return
    out = zoo.build(args.name, args.dir, size=args.size, seed=args.seed)
    print(f"built {args.name} ({args.size}) in {out}")


def cmd_reference(args) -> None:
    from fastdiff.zoo.reference import SIZES, build_reference

    if args.kind == "sd":
        from fastdiff.zoo.reference_sd import SIZES as SD_SIZES
        from fastdiff.zoo.reference_sd import build_reference_sd

        steps = dict(
            SD_SIZES["bench"],
            **{k: v for k, v in (("vae_steps", args.vae_steps), ("unet_steps", args.unet_steps)) if v},
        )
        out = build_reference_sd(args.dir, seed=args.seed, resume=args.resume, threads=args.threads, **steps)
        print(f"digits-sd reference model in {out}")
        return
    if args.minutes is not None:
        raise SystemExit(
            "error: --minutes was removed: the build now trains a fixed number of optimizer steps, so the model "
            f"depends only on --seed and --steps, not on machine load (use --steps N; default {args.steps})"
        )
    options = dict(SIZES["bench"], steps=args.steps)
    out = build_reference(
        args.dir,
        resolution=args.resolution,
        seed=args.seed,
        resume=args.resume,
        threads=args.threads,
        **options,
    )
    print(f"reference model in {out}")


def cmd_bench(args) -> None:
    from fastdiff.eval.bench import format_table, run_bench

    result = run_bench(
        resolve_model(args.model, args.size),
        parse_configs(args.config),
        steps=args.steps,
        runs=args.runs,
        seed=args.seed,
        threads=args.threads,
        batch=args.batch,
        height=args.height,
        width=args.width,
        guidance=args.guidance,
        json_path=args.json,
        quality=not args.no_quality,
        image_dir=args.images,
        warmup=not args.no_warmup,
        devices=args.devices,
        alternate=not args.no_alternate,
        max_load=args.max_load,
    )
    print(format_table(result))
    if args.json:
        print(f"wrote {args.json}")


def cmd_generate(args) -> None:
    import torch

    from fastdiff import FastPipeline
    from fastdiff.core.tensors import pixels
    from fastdiff.eval.grid import save_clips, save_grid, save_images

    model = resolve_model(args.model, args.size)
    call = {}
    if args.prompt:
        call["prompt"] = args.prompt
    if args.label:
        call["class_labels"] = args.label
    if not args.prompt and not args.label:
        call["batch_size"] = args.batch
    for key in ("num_inference_steps", "guidance_scale", "height", "width", "num_frames"):
        value = getattr(args, key)
        if value is not None:
            call[key] = value
    if args.devices > 1:  # worker processes with a process group, one guidance branch each
        from fastdiff.core.spec import runs_in_process_group
        from fastdiff.parallel.run import generate_parallel

        specs = args.accel or ""
        if not runs_in_process_group(specs):
            specs = ";".join(filter(None, [specs, f"parallel(mode=cfg,devices={args.devices})"]))
        images = generate_parallel(model, specs, call, args.devices, args.seed)["images"]
    else:
        fp = FastPipeline.from_pretrained(model, accelerators=args.accel or None)
        images = pixels(fp(**call, output_type="np", generator=torch.Generator().manual_seed(args.seed)))
    if images.ndim == 5:  # video pipelines: clips of frames
        paths = save_clips(images, args.out)
        print(f"wrote {len(paths)} clips ({images.shape[1]} frames each) and grid.png to {args.out}")
        return
    paths = save_images(images, args.out)
    save_grid(images, Path(args.out) / "grid.png", scale=max(1, 128 // images.shape[1]))
    print(f"wrote {len(paths)} images and grid.png to {args.out}")


def cmd_profile(args) -> None:
    import torch

    from fastdiff import FastPipeline
    from fastdiff.core.inputs import make_inputs
    from fastdiff.eval.profile import format_split, profile_call

    if args.threads:
        torch.set_num_threads(args.threads)
    fp = FastPipeline.from_pretrained(resolve_model(args.model, args.size), accelerators=args.accel or None)
    fp.pipe.set_progress_bar_config(disable=True)
    call = dict(make_inputs(fp.pipe, args.batch), output_type="np")
    if args.steps:
        call["num_inference_steps"] = args.steps
    fp(**call)  # warm-up
    totals, table = profile_call(fp, call, top=args.top)
    print(format_split(totals))
    print(table)


def cmd_compress(args) -> None:
    import json

    from fastdiff.compress.recover import compress_model

    report = compress_model(
        resolve_model(args.model, args.size),
        args.out,
        args.accel,
        recover_steps=args.recover_steps,
        lr=args.lr,
        batch=args.batch or 32,
        gt_weight=args.gt_weight,
        resume=not args.no_resume,
    )
    print(json.dumps(report, indent=2, default=str))
    print(f"compressed model in {args.out}; load it with fastdiff.compress.recover.load_compressed({args.out!r})")


def cmd_export_onnx(args) -> None:
    from fastdiff.compress.onnx_export import export_onnx
    from fastdiff.core.optional import require

    for module in ("onnx", "onnxruntime"):
        require(module, "fastdiff export-onnx")

    result = export_onnx(resolve_model(args.model, args.size), args.out, vae=args.vae, opset=args.opset)
    for key, value in result.items():
        print(f"{key}: {value}")


def cmd_demo(args) -> None:
    from fastdiff.cli.demo import run_demo

    run_demo(
        out_dir=args.out,
        runs=args.runs,
        quick=args.quick,
        retrain=args.retrain,
        threads=args.threads,
        images=args.images,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fastdiff", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"fastdiff-accel {fastdiff.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    zoo = sub.add_parser("zoo", help="build offline models")
    zoo_sub = zoo.add_subparsers(dest="zoo_cmd", required=True)
    zoo_sub.add_parser("list", help="list zoo models")
    build = zoo_sub.add_parser("build", help="build NAME into DIR")
    build.add_argument("name")
    build.add_argument("dir")
    build.add_argument(
        "--size",
        default="test",
        choices=["test", "bench", "full"],
        help="full: the real layouts (sd15, sdxl, dit-xl-2, sd35-medium)",
    )
    build.add_argument("--seed", type=NON_NEGATIVE, default=0)
    zoo.set_defaults(func=cmd_zoo)

    ref = sub.add_parser("reference", help="the digits reference models (class- or text-conditional)")
    ref_sub = ref.add_subparsers(dest="ref_cmd", required=True)
    rbuild = ref_sub.add_parser("build", help="train the reference model into DIR")
    rbuild.add_argument("dir")
    rbuild.add_argument("--steps", type=POSITIVE, default=3000, help="optimizer steps (batch 64); default 3000")
    rbuild.add_argument("--seed", type=NON_NEGATIVE, default=0)
    rbuild.add_argument("--threads", type=POSITIVE, default=None, help="torch threads")
    rbuild.add_argument("--resolution", type=int, default=16, choices=[16, 32])
    rbuild.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt up to --steps")
    rbuild.add_argument(
        "--kind",
        default="digits",
        choices=["digits", "sd"],
        help="digits: class-conditional UNet2DModel; sd: digits-sd, a StableDiffusionPipeline "
        "(VAE + CLIP text encoder + UNet2DConditionModel) on digit prompts",
    )
    rbuild.add_argument("--vae-steps", type=POSITIVE, default=None, help="--kind sd: VAE steps (default 500)")
    rbuild.add_argument(
        "--unet-steps",
        type=POSITIVE,
        default=None,
        help="--kind sd: text encoder + UNet steps (default 21000)",
    )
    rbuild.add_argument("--minutes", type=float, help=argparse.SUPPRESS)  # removed; kept to explain why
    ref.set_defaults(func=cmd_reference)

    def model_args(p):
        p.add_argument("model", help="pipeline directory or zoo name (built into the cache)")
        p.add_argument("--size", default="bench", choices=["test", "bench"], help="zoo size when MODEL is a name")
        p.add_argument("--threads", type=POSITIVE, default=None, help="torch threads")
        p.add_argument("--batch", type=POSITIVE, default=None, help="images per call")

    bench = sub.add_parser("bench", help="compare configs side by side")
    model_args(bench)
    bench.add_argument("--config", action="append", required=True, metavar="NAME=SPECS", type=named_specs)
    bench.add_argument("--steps", type=POSITIVE, default=20, help="steps for configs that do not set them")
    bench.add_argument("--runs", type=POSITIVE, default=3)
    bench.add_argument("--seed", type=NON_NEGATIVE, default=0)
    bench.add_argument("--height", type=POSITIVE)
    bench.add_argument("--width", type=POSITIVE)
    bench.add_argument("--guidance", type=FINITE)
    bench.add_argument("--json", help="write results JSON here")
    bench.add_argument("--images", help="write a PNG grid per config into this directory")
    bench.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run per config")
    bench.add_argument("--no-quality", action="store_true", help="skip model-specific quality metrics")
    bench.add_argument(
        "--no-alternate",
        action="store_true",
        help="time each config's runs back to back instead of in alternating rounds",
    )
    bench.add_argument(
        "--max-load",
        type=NON_NEGATIVE_FLOAT,
        default=None,
        help="refuse to time a round while the load average, less this run's threads, is above this",
    )
    bench.add_argument(
        "--devices",
        type=POSITIVE,
        default=1,
        help="worker processes for configs with parallel(...) (gloo on CPU, nccl on GPUs); every config then runs with freed memory kept for reuse (glibc), as the workers do",
    )
    bench.set_defaults(func=cmd_bench)

    gen = sub.add_parser("generate", help="write PNGs")
    model_args(gen)
    gen.add_argument("--accel", default="", type=accel_specs, help="accelerator specs, ';'-separated")
    gen.add_argument("--prompt", nargs="+")
    gen.add_argument("--label", nargs="+", type=NON_NEGATIVE)
    gen.add_argument("--steps", dest="num_inference_steps", type=POSITIVE)
    gen.add_argument("--guidance", dest="guidance_scale", type=FINITE)
    gen.add_argument("--height", type=POSITIVE)
    gen.add_argument("--width", type=POSITIVE)
    gen.add_argument("--frames", type=POSITIVE, dest="num_frames", help="clip length (video models)")
    gen.add_argument("--seed", type=NON_NEGATIVE, default=0)
    gen.add_argument("--out", required=True, help="directory for the images (video: an animated GIF per clip)")
    gen.add_argument(
        "--devices",
        type=POSITIVE,
        default=1,
        help="worker processes (gloo on CPU, nccl on GPUs) for the parallel accelerator (default mode=cfg); started and stopped here",
    )
    gen.set_defaults(func=cmd_generate)

    prof = sub.add_parser("profile", help="time split and top operators of one call")
    model_args(prof)
    prof.add_argument("--accel", default="", type=accel_specs)
    prof.add_argument("--steps", type=POSITIVE, default=None)
    prof.add_argument("--top", type=POSITIVE, default=15)
    prof.set_defaults(func=cmd_profile)

    comp = sub.add_parser("compress", help="apply weight-changing accelerators, recover by distillation, save")
    model_args(comp)
    comp.add_argument("out")
    comp.add_argument("--accel", required=True, type=accel_specs, help="compress specs, e.g. 'prune(ratio=0.5)'")
    comp.add_argument("--recover-steps", type=NON_NEGATIVE, default=200)
    comp.add_argument("--lr", type=POSITIVE_FLOAT, default=5e-4)
    comp.add_argument("--gt-weight", type=NON_NEGATIVE_FLOAT, default=0.0, help="weight of the plain denoising loss")
    comp.add_argument("--no-resume", action="store_true")
    comp.set_defaults(func=cmd_compress)

    onnx = sub.add_parser("export-onnx", help="export the denoiser (and VAE decoder) to ONNX, checked")
    model_args(onnx)
    onnx.add_argument("out")
    onnx.add_argument("--vae", action="store_true", help="also export the VAE decoder")
    onnx.add_argument("--opset", type=POSITIVE, default=17)
    onnx.set_defaults(func=cmd_export_onnx)

    demo = sub.add_parser("demo", help="the main job: reference model, baseline vs accelerated")
    demo.add_argument("--out", default="out/demo")
    demo.add_argument("--runs", type=POSITIVE, default=1, help="timed calls per config")
    demo.add_argument("--images", type=POSITIVE, default=None, help="images per call (default 500; --quick: 100)")
    demo.add_argument(
        "--threads",
        type=POSITIVE,
        default=1,
        help="torch threads (default 1: steady timings on a shared machine)",
    )
    demo.add_argument(
        "--retrain", action="store_true", help="train the reference (3000 steps) instead of the shipped one"
    )
    demo.add_argument("--quick", action="store_true", help="200-step reference model (for smoke tests)")
    demo.set_defaults(func=cmd_demo)
    for name in COMMAND_MODULES:  # commands defined beside their subsystem: each module registers its own
        importlib.import_module(f"fastdiff.cli.{name}").register(sub)
    for command in commands(parser).values():  # errors name the command: "fastdiff distill progressive: ..."
        command.set_defaults(_prog=command.prog)
    return parser


def commands(parser: argparse.ArgumentParser) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every leaf command's parser, by its words: ``{("zoo", "build"): ..., ("bench",): ...}``."""
    found = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.update({(name, *k): v for k, v in commands(sub).items()} or {(name,): sub})
    return found


COMMAND_MODULES = ("distill", "schedule", "classifier_guidance", "serve", "tune", "tpu", "cache")


# ValueError raised in these modules checks what the user gave (diffusers: a pipeline's check_inputs, a
# scheduler's step count); elsewhere (torch, numpy, ...) it may be a bug and keeps its traceback.
USER_ERROR_MODULES = ("fastdiff.", "diffusers.pipelines.", "diffusers.schedulers.")


def user_error(exc: BaseException) -> bool:
    """A bad path, a fastdiff error type (all are ValueErrors), or a ValueError from USER_ERROR_MODULES."""
    if isinstance(exc, PATH_ERRORS):
        return True
    if not isinstance(exc, ValueError):
        return False
    if type(exc).__module__.startswith("fastdiff."):
        return True
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith(USER_ERROR_MODULES)


def main(argv: list[str] | None = None) -> None:
    """Run a command; a user error exits 2 with one ``fastdiff CMD: error: ...`` line, never a traceback."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(argv)
    prog = getattr(args, "_prog", "fastdiff")
    try:
        args.func(args)
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a command's own `raise SystemExit("error: ...")`
            raise error_exit(prog, exc.code) from None
        raise
    except Exception as exc:
        if not user_error(exc):
            raise  # a bug: keep its traceback
        raise error_exit(prog, str(exc)) from exc


if __name__ == "__main__":
    main()
