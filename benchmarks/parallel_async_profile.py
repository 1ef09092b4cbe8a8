"""Where the time of a digits ``parallel(mode=async)`` call goes, per rank: own layers, the activation
exchange, the prediction broadcast (waiting for the slower stage included), extrapolation, the rest.

Wraps the async state's and the exchange's methods with timers in the workers (a measurement aid, not part of
fastdiff). Five calls of the digits bench batch (500 images, guidance 2, dpm++2m 20); from the second call on,
each may re-cut the stages (on the previous call's staged timings) until they are balanced.

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/parallel_async_profile.py
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from pathlib import Path

import torch

from fastdiff.eval.record import write_record
from fastdiff.parallel.launch import launch

RESULTS = Path(__file__).resolve().parent / "results"
SPECS = "scheduler(name=dpm++2m,steps=20);parallel(mode=async,devices=2,warmup=2,extrapolate=1)"


def _timers(seconds: dict, states: list) -> None:
    """Accumulate staged-step seconds of the async state's communication and extrapolation and of the layer
    hooks (``states``: filled with the state once it exists)."""
    from fastdiff.parallel import async_ as a
    from fastdiff.parallel import async_exchange as x
    from fastdiff.parallel import async_state as s

    def timed(cls, name, key):
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            start = time.perf_counter()
            try:
                return original(self, *args, **kwargs)
            finally:  # the denoiser hook's call decides ``sequential`` as it begins: read it afterwards
                if states and not states[0].sequential:
                    seconds[key] += time.perf_counter() - start

        setattr(cls, name, wrapper)

    timed(s.AsyncState, "share_prediction", "share_prediction")
    timed(s.Extrapolation, "carry", "extrapolate")
    # blocking, or posted (on rank 0 inside its layers' time)
    for cls, name in (
        (x.BlockingExchange, "begin"),
        (x.OverlappedExchange, "_collect"),
        (x.OverlappedExchange, "_post"),
    ):
        timed(cls, name, "exchange")
    timed(a.StageUnitHook, "new_forward", "own_layers")
    timed(a.AsyncDenoiserHook, "new_forward", "staged_denoiser_calls")


def profile(rank: int, world: int, model: str, call: dict, calls: int) -> list[list[dict]]:
    import torch.distributed as dist

    from fastdiff import FastPipeline

    seconds: dict[str, float] = collections.defaultdict(float)
    states: list = []
    _timers(seconds, states)
    fp = FastPipeline.from_pretrained(model)
    fp.pipe.set_progress_bar_config(disable=True)
    handle = fp.accelerate(SPECS)
    state = next(h.state for h in handle.handles if "state" in h.info)
    states.append(state)
    out = []
    for _ in range(calls):
        seconds.clear()
        dist.barrier()
        start = time.perf_counter()
        fp(**call, output_type="np", generator=torch.Generator().manual_seed(0))
        seconds["call"] = time.perf_counter() - start
        seconds["rest_of_staged"] = seconds["staged_denoiser_calls"] - sum(
            seconds[k] for k in ("own_layers", "exchange", "share_prediction", "extrapolate")
        )
        record = {k: round(v, 2) for k, v in seconds.items()}
        record.update(
            layers_per_stage=[len(state.plan.units(s)) for s in range(world)],
            settled=state.settled,
            shared_rows={n: round(f, 3) for n, (_, f) in state.plan.split.items()},
        )
        everyone = [None] * world
        dist.all_gather_object(everyone, record)
        out.append(everyone)
    return out


def digits_bench_call(cache: Path) -> tuple[str, dict]:
    """The shipped digits model's path and the bench call: 500 images, guidance 2."""
    from fastdiff import load_pipeline
    from fastdiff.eval.bench import make_inputs
    from fastdiff.zoo.shipped import ensure_digits

    model = ensure_digits(cache / "digits")
    return str(model), make_inputs(load_pipeline(model), 500, 2.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "parallel_async_profile.json")
    parser.add_argument("--cache", type=Path, default=Path(".fastdiff-cache"))
    args = parser.parse_args()
    calls = launch(profile, 2, *digits_bench_call(args.cache), args.calls, timeout_s=1200)
    for index, ranks in enumerate(calls):
        print(f"call {index}:", json.dumps(ranks), flush=True)
    RESULTS.mkdir(exist_ok=True)
    write_record(args.out, {"specs": SPECS, "images": 500, "calls": calls}, benchmark="parallel_async_profile")


if __name__ == "__main__":
    main()
