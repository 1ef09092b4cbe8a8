"""Host time fastdiff adds per denoising step, with no accelerator and with each accelerator.

On a GPU an eager denoiser step is a train of kernel launches; Python work (and launches) the wrapper and its
hooks add per step show directly in the step time. Two measurements, one torch thread, small inputs:

1. **Identity denoiser** (no accelerator): a hook makes tiny-sd's UNet return its input at no cost inside a
   real ``StableDiffusionPipeline``, so a call is the pipeline's own Python plus what the wrapper adds. Calls
   alternate raw / wrapped, at N and 9N steps; the added time per step is the slope of (wrapped - raw) over the
   step count, from the fastest call of each kind (timeit's rule: a shared machine's noise only ever adds),
   with the spread of the per-round slopes; the rest is per call.
2. **Per accelerator** (the real test-size UNet or SD3 transformer, so block hooks fire): a clock around every
   module that carries fastdiff hooks counts the time spent in its hook chain, minus the module's own forward
   inside it (so nested hooked modules count once, and the model's compute never). That is fastdiff's Python
   plus the tensor operations its hooks launch (on tensors this small, what a launch costs). Per step: the
   difference between a 16- and an 8-step call, divided by 8, so per-call work drops out; median of the
   repeats, with min and max.

   A hooked module's own forward is taken out wherever it is called from: TeaCache's call of the first block's
   adaLN layer counts as the model's (the block reuses that output on the steps it computes).
3. **Peers**, under the same wrapper (their rows include its step-context hook): diffusers' own First Block Cache
   (``FirstBlockCacheConfig``) on tiny-flux, its hooks clocked the same way, beside fastdiff's
   ``blockcache(mode=first-block)``; tomesd 0.1.3's token merging on tiny-sd beside fastdiff's ``tome``
   (tomesd patches block classes, so its matching and its merge and unmerge functions are clocked instead of
   hooks): what the algorithm costs when the reference library runs it.
4. **Floor**: hooks that do nothing, on every block and the transformer (where first-block puts its hooks), clocked
   the same way: what the hook chains alone read around real blocks on this machine (after a block's compute the
   next Python runs on cold caches), so each threshold cache's own work is its row minus this one.

Targets: <= 20 us per step with no accelerator, <= 100 us for hook-based accelerators.

    python benchmarks/host_cost.py --pairs 15 --repeats 5 --json benchmarks/results/host_cost.json
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path

import torch
from diffusers.hooks import FirstBlockCacheConfig, HookRegistry, ModelHook

from fastdiff import FastPipeline
from fastdiff.cache.blockio import blocks_in_order
from fastdiff.core.denoisers import denoiser_facts
from fastdiff.core.hooks import GatedHook, install_hooks
from fastdiff.eval.record import write_record
from fastdiff.zoo.tiny import make_pipeline

FLOOR = "empty hooks where first-block hooks (floor)"
UNET_SPECS = [
    "none",
    "deepcache(interval=3)",
    "tome(ratio=0.5)",
    "tomesd apply_patch(ratio=0.5)",  # peer
    "cfg-interval(start=0.0,end=0.5)",
    "forecast(order=1,interval=2,warmup=2)",
    "promptcache",
    "scheduler(name=dpm++2m)",
]
SD3_SPECS = [
    "none",
    "blockcache(mode=interval,interval=2)",
    FLOOR,
    "blockcache(mode=first-block,threshold=0.1)",
    "blockcache(mode=teacache,threshold=0.3)",
    "forecast(order=1,interval=2,warmup=2)",
]


class MergeClock:
    """tomesd's token merging, clocked: its ``compute_merge`` and the merge/unmerge functions it returns (benchmark
    only; tomesd patches block classes, so there is no hook chain to clock)."""

    def __init__(self, fp) -> None:
        import tomesd
        from tomesd import patch

        pipe = fp.pipe
        self.total, self.pipe, self.patch, self.compute = 0.0, pipe, patch, patch.compute_merge
        patch.compute_merge = self.timed(lambda x, info: tuple(self.timed(f) for f in self.compute(x, info)))
        tomesd.apply_patch(pipe, ratio=0.5)

    def timed(self, fn):
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.total += time.perf_counter() - start

        return run

    def close(self) -> None:
        import tomesd

        tomesd.remove_patch(self.pipe)
        self.patch.compute_merge = self.compute


def first_block_peer(fp) -> None:
    fp.pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=0.1))


class PassThrough(ModelHook):
    """Calls the block's forward and returns its output: the floor of a block hook (benchmark only)."""

    def new_forward(self, module, *args, **kwargs):
        return self.fn_ref.original_forward(*args, **kwargs)


class PassThroughPre(ModelHook):
    """A pre-forward that passes its arguments on, as blockcache's controller on the transformer (benchmark only)."""

    def pre_forward(self, module, *args, **kwargs):
        return args, kwargs


def empty_hooks(fp) -> None:
    """Hooks that do nothing, where first-block puts its hooks (every block, and the transformer): what the clock
    reads for the hook chains alone around real blocks (cold caches after each block's compute included)."""
    model = fp.denoiser
    blocks = blocks_in_order(model, denoiser_facts(model, "host_cost"))
    install_hooks([(b, PassThrough()) for b in blocks] + [(model, PassThroughPre())], "fastdiff.empty", fp.context)


# peers beside fastdiff's rows: diffusers' own First Block Cache on Flux (SD3's transformer has no enable_cache in
# diffusers; its hooks are named fbc_*), and tomesd's ToMe on SD; and the floor of first-block's hook layout
PEERS = {
    "diffusers FirstBlockCacheConfig(threshold=0.1)": first_block_peer,
    "tomesd apply_patch(ratio=0.5)": MergeClock,
    FLOOR: empty_hooks,
}
FLUX_SPECS = [
    "none",
    FLOOR,
    "blockcache(mode=first-block,threshold=0.1)",
    "diffusers FirstBlockCacheConfig(threshold=0.1)",
]
CALLS = {
    "tiny-sd": {"prompt": ["a cat", "a dog"], "output_type": "latent"},
    "tiny-sd3": {"prompt": ["a cat", "a dog"], "output_type": "latent", "height": 32, "width": 32},
    "tiny-flux": {"prompt": ["a cat", "a dog"], "output_type": "latent", "height": 32, "width": 32},
}


class IdentityDenoiser(ModelHook):
    """Returns the noisy sample unchanged: a denoiser that costs nothing (benchmark only)."""

    def new_forward(self, module, *args, **kwargs):
        return (args[0] if args else kwargs["sample"],)


def seconds(fn, call: dict) -> float:
    start = time.perf_counter()
    fn(**call)
    return time.perf_counter() - start


def identity_cost(steps: int, pairs: int) -> dict:
    """Added time per step: the slope of (wrapped - raw) from ``steps`` to ``9 * steps`` steps, so what the
    wrapper does once per call (argument checks, hook setup) drops out. The estimate uses the fastest call of
    each kind; the per-round slopes give its spread."""
    pipe = make_pipeline("tiny-sd", "test")
    pipe.set_progress_bar_config(disable=True)
    HookRegistry.check_if_exists_or_initialize(pipe.unet).register_hook(IdentityDenoiser(), "identity")
    fp = FastPipeline(pipe)
    counts = (steps, 9 * steps)
    times: dict[tuple[str, int], list[float]] = {(kind, n): [] for kind in ("raw", "wrapped") for n in counts}
    for i in range(pairs + 2):  # two warm-up rounds
        for n in counts:
            call = dict(CALLS["tiny-sd"], num_inference_steps=n)
            r, w = seconds(pipe, call), seconds(fp, call)
            if i >= 2:
                times["raw", n].append(r)
                times["wrapped", n].append(w)

    def slope(pick) -> float:
        added = [pick(times["wrapped", n]) - pick(times["raw", n]) for n in counts]
        return (added[1] - added[0]) / (counts[1] - counts[0])

    per_step = slope(min)
    rounds = [slope(lambda values, k=k: values[k]) for k in range(pairs)]
    added_first = min(times["wrapped", steps]) - min(times["raw", steps])
    return {
        "steps": list(counts),
        "pairs": pairs,
        "rule": "fastest call of each kind; spread over rounds",
        "added_us_per_step": 1e6 * per_step,
        "added_us_per_step_rounds_min": 1e6 * min(rounds),
        "added_us_per_step_rounds_max": 1e6 * max(rounds),
        "added_us_per_call": 1e6 * (added_first - steps * per_step),
    }


class HookClock:
    """Time inside fastdiff's hook chains, the hooked modules' own forwards excluded (benchmark only)."""

    def __init__(self) -> None:
        self.total = 0.0
        self._children: list[float] = []  # per open frame: time of the frames nested in it

    def _timed(self, forward, args, kwargs) -> tuple[object, float, float]:
        start = time.perf_counter()
        self._children.append(0.0)
        try:
            output = forward(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            children = self._children.pop()
            if self._children:
                self._children[-1] += elapsed
        return output, elapsed, children

    def chain(self, forward, *args, **kwargs):
        output, elapsed, children = self._timed(forward, args, kwargs)
        self.total += elapsed - children  # the module's own forward and nested chains are children
        return output

    def own(self, forward, *args, **kwargs):
        return self._timed(forward, args, kwargs)[0]

    def attach(self, root: torch.nn.Module, peer: str | None = None) -> int:
        """Clock every module of ``root`` that carries a fastdiff hook (or a hook named ``peer*``: diffusers' own
        hooks, for the peer rows); returns how many."""
        count = 0
        for module in root.modules():
            registry = getattr(module, "_diffusers_hook", None)
            hooks = registry.hooks.items() if registry is not None else ()
            if not any(isinstance(h, GatedHook) or (peer and name.startswith(peer)) for name, h in hooks):
                continue
            innermost = registry._fn_refs[0]
            slot = "original_forward" if innermost.original_forward is not None else "forward"
            setattr(innermost, slot, functools.partial(self.own, getattr(innermost, slot)))
            module.forward = functools.partial(self.chain, module.forward)  # a partial: not a foreign forward
            count += 1
        return count


def accelerator_cost(model: str, spec: str, repeats: int) -> dict:
    from fastdiff.zoo.tiny_flow import make_flow_pipeline

    torch.manual_seed(0)
    pipe = make_pipeline(model, "test") if model == "tiny-sd" else make_flow_pipeline(model)
    pipe.set_progress_bar_config(disable=True)
    peer = spec in PEERS
    fp = FastPipeline(pipe, accelerators=None if spec == "none" or peer else spec)
    # a peer's own implementation, under the same wrapper (its step-context hook included)
    merges = PEERS[spec](fp) if peer else None
    clock = HookClock()
    components = [m for m in pipe.components.values() if isinstance(m, torch.nn.Module)]
    modules = sum(clock.attach(m, peer="fbc_" if peer else None) for m in components)
    fp(**CALLS[model], num_inference_steps=8)  # warm-up

    def hook_seconds(steps: int) -> float:
        clock.total = 0.0
        if merges is not None:
            merges.total = 0.0
        fp(**CALLS[model], num_inference_steps=steps)
        return clock.total + (merges.total if merges is not None else 0.0)

    per_step = [(hook_seconds(16) - hook_seconds(8)) / 8 for _ in range(repeats)]
    if merges is not None:
        merges.close()
    return {
        "model": model,
        "spec": spec,
        "hooked_modules": modules,
        "us_per_step": 1e6 * statistics.median(per_step),
        "us_per_step_min": 1e6 * min(per_step),
        "us_per_step_max": 1e6 * max(per_step),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    identity = identity_cost(args.steps, args.pairs)
    print(
        f"identity denoiser, no accelerator: {identity['added_us_per_step']:+.1f} us per step (rounds "
        f"{identity['added_us_per_step_rounds_min']:+.1f} to {identity['added_us_per_step_rounds_max']:+.1f}), "
        f"{identity['added_us_per_call']:+.0f} us per call"
    )
    rows = []
    for model, specs in (("tiny-sd", UNET_SPECS), ("tiny-sd3", SD3_SPECS), ("tiny-flux", FLUX_SPECS)):
        for spec in specs:
            rows.append(accelerator_cost(model, spec, args.repeats))
            r = rows[-1]
            print(
                f"{model:9s} {spec:48s} {r['us_per_step']:7.1f} us per step in hooks "
                f"({r['us_per_step_min']:.1f}-{r['us_per_step_max']:.1f}, {r['hooked_modules']} modules)"
            )
    if args.json:
        result = {
            "benchmark": "host_cost",
            "device": "CPU, 1 torch thread",
            "command": f"python benchmarks/host_cost.py --pairs {args.pairs} --repeats {args.repeats} "
            f"--steps {args.steps} --json {args.json}",
            "targets_us_per_step": {"no accelerator": 20, "hook-based": 100},
            "identity": identity,
            "accelerators": rows,
        }
        write_record(args.json, result, benchmark="host_cost", indent=2)


if __name__ == "__main__":
    main()
