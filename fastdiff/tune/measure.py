"""Measuring one candidate for the tuner: ``fastdiff bench``'s own ``run_bench``, cached on disk.

Every measurement is one ``run_bench`` call on a shared pipeline (same inputs from ``make_inputs``, same
timing and quality code as ``fastdiff bench``), on the measurer's seed or on the seed a call names (the tuner
selects on one seed and reports on another); the images of the timed call are kept so PSNR/SSIM are computed
against the baseline's images of the same size and seed (``fastdiff.eval.fidelity``, as bench does).
Results are cached as JSON under ``cache_dir``, keyed by the spec, the model's hash, the fastdiff version and
the measurement settings (images, guidance, the seed of that measurement, runs, warm-up, threads, steps) and,
for candidates, the baseline (their PSNR/SSIM are against its images), so an interrupted search resumes where
it stopped and measurements on two seeds never mix. Cached timings come from the run that made them.

Example::

    from fastdiff.tune.measure import Measurer

    m = Measurer("/tmp/digits", cache_dir="/tmp/tune-cache", threads=1)
    base = m.measure("scheduler(name=dpm++2m,steps=20)", images=100, baseline=True)
    row = m.measure("scheduler(name=unipc,steps=5)", images=100)
    print(row["cpu_seconds_median"], row["accuracy"], row["psnr"])
    m.measure("scheduler(name=dpm++2m,steps=20)", images=100, baseline=True, seed=1)  # another sample
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastdiff.core.models import pipeline_facts
from fastdiff.core.pipeline import FastPipeline

KEEP = (
    "seconds_median",
    "seconds",
    "cpu_seconds_median",
    "denoiser_calls",
    "peak_rss_mb",
    "accuracy",
    "fd",
    "fd_floor",
    "ode_error",
)


class _Recording(FastPipeline):
    """A FastPipeline that keeps the images of its latest call (for PSNR against the baseline)."""

    def __call__(self, *args, **kwargs):
        output = super().__call__(*args, **kwargs)
        self.__dict__["last_images"] = np.asarray(output.images)
        return output


def fastdiff_version() -> str:
    import fastdiff

    return fastdiff.__version__


def model_hash(directory: str | Path, big: int = 64 * 2**20) -> str:
    """sha256 over the pipeline directory's files (names and bytes; files over ``big`` bytes: name, size, mtime)."""
    root, digest = Path(directory), hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        digest.update(rel.encode() + b"\0")
        stat = path.stat()
        if stat.st_size > big:
            digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
        else:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _fingerprint(spec: str) -> dict[str, str]:
    """Size/mtime fingerprints of directories or files a spec names (``path=``): retrained students re-measure."""
    out = {}
    for value in re.findall(r"path=([^,;)]+)", spec):
        path = Path(value).expanduser()
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        digest = hashlib.sha256()
        for f in files:
            if f.exists():
                stat = f.stat()
                digest.update(f"{f}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        out[value] = digest.hexdigest()[:16]
    return out


@contextlib.contextmanager
def _quiet_bench_bars():
    """run_bench draws a bar per call; inside the tuner's own bar those are noise, so they are disabled."""
    from fastdiff.eval import bench

    original = bench.tqdm
    bench.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        bench.tqdm = original


class Measurer:
    """Measures specs on one model with fixed settings; ``measure(spec, images)`` returns a result row."""

    def __init__(
        self,
        model: str | Path,
        cache_dir: str | Path | None = None,
        guidance: float | None = None,
        seed: int = 0,
        threads: int | None = 1,
        steps: int | None = 20,
        runs: int = 1,
        warmup: bool = False,
    ):
        self.model = Path(model)
        if threads:
            torch.set_num_threads(threads)
        self.fp = _Recording.from_pretrained(self.model, accelerators="")
        self.fp.pipe.set_progress_bar_config(disable=True)
        self.facts = pipeline_facts(self.fp.pipe)
        self.guidance = guidance
        self.settings = {
            "guidance": guidance,
            "seed": seed,
            "threads": torch.get_num_threads(),
            "steps": steps,
            "runs": runs,
            "warmup": warmup,
        }
        self._warm_up()
        self.model_hash = model_hash(self.model)
        self.version = fastdiff_version()
        self.cache_dir = Path(cache_dir) / self.model_hash[:16] if cache_dir else None
        self.references: dict[tuple[int, int], np.ndarray] = {}  # (seed, images) -> the baseline's images
        self.baseline_spec: str | None = None
        self.hits = 0
        self.runs = 0

    def _warm_up(self) -> None:
        """One small untimed call, so that the first timed measurement (the baseline) pays no first-call costs."""
        from fastdiff.core.inputs import make_inputs

        call = dict(make_inputs(self.fp.pipe, 2, self.guidance), output_type="np", num_inference_steps=2)
        self.fp(**call, generator=torch.Generator().manual_seed(0))
        self.fp.__dict__.pop("last_images", None)

    @property
    def cfg(self) -> bool:
        """Whether the measured calls run classifier-free guidance (guidance-kind accelerators matter)."""
        from fastdiff.core.inputs import make_inputs
        from fastdiff.core.models import cfg_enabled, separate_cfg

        call = make_inputs(self.fp.pipe, 1, self.guidance)  # batched branches, or one call per branch (Wan)
        return cfg_enabled(self.fp.pipe, call) or separate_cfg(self.fp.pipe, call)

    def key(self, spec: str, images: int, baseline: bool = False, seed: int | None = None) -> str:
        # a candidate's PSNR/SSIM are against the baseline's images, so its key names the baseline too; the
        # seed is that of this measurement (the settings' seed unless another is named), so samples never mix
        versus = None if baseline else self.baseline_spec
        blob = {
            "spec": spec,
            "model": self.model_hash,
            "fastdiff": self.version,
            "images": images,
            "paths": _fingerprint(spec),
            "versus": versus,
            **self.settings,
            "seed": self.settings["seed"] if seed is None else seed,
        }
        return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:32]

    def measure(self, spec: str, images: int, baseline: bool = False, seed: int | None = None) -> dict[str, Any]:
        """The row of ``spec`` on ``images`` images (cached), on ``seed`` (default: the settings' seed); the
        baseline's images become the PSNR reference for that image count and seed."""
        seed = self.settings["seed"] if seed is None else seed
        if baseline:
            if self.baseline_spec not in (None, spec):
                self.references.clear()  # another baseline: its images become the reference
            self.baseline_spec = spec
        key = self.key(spec, images, baseline, seed)
        cached = self._load(key, baseline, seed)
        if cached is not None:
            self.hits += 1
            return cached
        from fastdiff.eval.bench import run_bench
        from fastdiff.eval.fidelity import psnr, ssim

        if not baseline and (seed, images) not in self.references:
            raise RuntimeError(f"measure the baseline at {images} images on seed {seed} first")
        s = self.settings
        try:
            with _quiet_bench_bars():
                result = run_bench(
                    self.fp,
                    [(spec, spec)],
                    steps=s["steps"],
                    runs=s["runs"],
                    seed=seed,
                    threads=s["threads"],
                    batch=images,
                    guidance=self.guidance,
                    warmup=s["warmup"],
                )
        except (ValueError, RuntimeError, FloatingPointError) as error:  # refused or failed: not cached
            self.fp.remove_all()
            if baseline:
                raise
            return {"spec": spec, "images": images, "seed": seed, "error": f"{type(error).__name__}: {error}"}
        self.runs += 1
        full = result["configs"][0]
        row = {"spec": spec, "images": images, "seed": seed, **{k: full[k] for k in KEEP if full.get(k) is not None}}
        shot = self.fp.__dict__.pop("last_images")
        if baseline:
            row["is_baseline"] = True
            self.references[seed, images] = shot
        else:
            reference = self.references[seed, images]
            row["psnr"], row["ssim"] = psnr(shot, reference), ssim(shot, reference)
        self._store(key, row, shot if baseline else None)
        return row

    def _load(self, key: str, baseline: bool, seed: int) -> dict | None:
        if self.cache_dir is None or not (self.cache_dir / f"{key}.json").is_file():
            return None
        row = json.loads((self.cache_dir / f"{key}.json").read_text())
        if baseline:
            images_file = self.cache_dir / f"{key}.npy"
            if not images_file.is_file():
                return None
            self.references[seed, row["images"]] = np.load(images_file)
        row["seed"] = seed  # the key names it (rows cached before rows carried their seed lack it)
        row["cached"] = True
        return row

    def _store(self, key: str, row: dict, images: np.ndarray | None) -> None:
        if self.cache_dir is None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        if images is not None:
            np.save(self.cache_dir / f"{key}.npy", images)
        tmp = self.cache_dir / f"{key}.json.tmp{os.getpid()}"
        tmp.write_text(json.dumps(row, indent=1))
        tmp.replace(self.cache_dir / f"{key}.json")  # atomic: an interrupted write never leaves half a row
