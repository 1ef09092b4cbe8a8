"""``parallel(mode=ulysses|ring)``: the denoiser's token sequence split across ranks (sequence parallelism).

diffusers' own context parallelism does the work: ``ModelMixin.enable_parallelism`` with a
``ContextParallelConfig`` and the transformer's ``_cp_plan`` (which inputs to split, where to gather) splits the
image/video tokens across the ranks before the blocks, exchanges attention (Ulysses: all-to-all over heads; ring:
key/value chunks passed around the ranks) and gathers the output. Every rank runs the same call with the same
seed; each computes its share of the tokens and gets the whole output. fastdiff adds the refusals, the launcher
(``fastdiff generate/bench --devices N``, ``fastdiff.parallel.launch``) and an exact ``remove()``.

- ``mode=ulysses``: any sequence length and head count (diffusers' ``ulysses_anything``); runs on gloo (CPU) and
  nccl. On CPU, diffusers' setup divides by ``torch.accelerator.device_count()`` (0 there), so fastdiff reports
  one device while it sets up.
- ``mode=ring``: diffusers' ring attention needs an attention backend that returns the log-sum-exp (flash,
  ``_native_cudnn``, sage: CUDA kernels); the default ``native`` (SDPA) does not, so ring is refused there.

Transformers with a context-parallel plan in diffusers 0.42 among the zoo's families: Flux (dev, schnell), Flux.2
(and Klein), Qwen-Image, Wan; LTX-Video has a plan but its text mask breaks diffusers' Ulysses attention, so it is
refused (``no_sequence_parallel`` in models.py), as are families without a plan. Caches that decide from the whole token sequence
(``blockcache``) and token merging (``tome``) are refused beside it (both touch ``denoiser.tokens``).

Example (``torchrun --nproc-per-node 2 script.py``)::

    import torch.distributed as dist
    from fastdiff import FastPipeline

    dist.init_process_group("gloo")
    fp = FastPipeline.from_pretrained("/tmp/tiny-wan", accelerators="parallel(mode=ulysses,devices=2)")
    frames = fp(prompt="a red fox", num_inference_steps=4, output_type="np").frames   # same on every rank
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, Literal

import torch

from fastdiff.core.denoisers import DENOISERS
from fastdiff.core.diffusers_compat import context_parallel_hooked
from fastdiff.core.hooks import Handle, remove_hook, tracked_registry
from fastdiff.core.models import UnsupportedModelError
from fastdiff.core.options import option
from fastdiff.core.registry import AcceleratorError, register
from fastdiff.parallel.group import ParallelConfig

if TYPE_CHECKING:
    from fastdiff.core.pipeline import FastPipeline

_MISSING = object()


class SequenceParallelConfig(ParallelConfig):
    """What ``ulysses`` and ``ring`` share; subclasses give diffusers' ``ContextParallelConfig`` options."""

    touches = frozenset({"denoiser.forward", "denoiser.tokens", "denoiser.attn_processors"})
    exclusive = frozenset({"denoiser.tokens", "denoiser.attn_processors"})

    def context_parallel_options(self) -> dict:
        raise NotImplementedError

    def check_backend(self, backend: str, where: str) -> None:
        """Refuse an attention backend this mode cannot run on."""

    def apply(self, fp: FastPipeline) -> Handle:
        return self.enable(fp)

    def enable(self, fp, **options) -> Handle:
        """diffusers' context parallelism on ``fp``'s denoiser, with ``options`` for ``ContextParallelConfig``
        beside this mode's own (``mesh=``: the ranks that share the sequence, when they are not the world)."""
        from diffusers import ContextParallelConfig

        where, denoiser = f"parallel(mode={self.mode})", fp.denoiser  # type: ignore[attr-defined]
        name = type(denoiser).__name__
        plan = getattr(denoiser, "_cp_plan", None)
        if not plan:
            raise UnsupportedModelError(
                f"{where}: diffusers has no context-parallel plan (_cp_plan) for {name}; transformers with one: "
                f"{', '.join(planned_transformers())}"
            )
        broken = DENOISERS[name].no_sequence_parallel if name in DENOISERS else ""
        if broken:
            raise UnsupportedModelError(f"{where} refused on {name}: {broken}")
        if getattr(denoiser, "_parallel_config", None) is not None:
            raise AcceleratorError(f"{where}: {name} already runs in parallel (enable_parallelism was called on it)")
        processors = attention_processors(denoiser)
        backends = {getattr(p, "_attention_backend", None) or "native" for p in processors}
        for backend in backends:
            self.check_backend(str(getattr(backend, "value", backend)), where)
        self.group_rank()
        hooked = context_parallel_hooked(denoiser, plan)
        saved = [(p, p.__dict__.get("_parallel_config", _MISSING)) for p in processors]
        for module in hooked:
            tracked_registry(module)
        try:
            with _one_device_per_rank():
                config = ContextParallelConfig(**self.context_parallel_options(), **options)
                denoiser.enable_parallelism(config=config)
        except (ValueError, RuntimeError) as error:
            _undo(denoiser, hooked, saved)
            raise AcceleratorError(f"{where} on {name}: {error}") from error
        return Handle(lambda: _undo(denoiser, hooked, saved))


@register
@dataclasses.dataclass(frozen=True)
class ParallelUlysses(SequenceParallelConfig):
    """The token sequence split over ``devices`` ranks, attention exchanged all-to-all (DeepSpeed-Ulysses).
    Example: ``parallel(mode=ulysses,devices=2)``."""

    mode: Literal["ulysses"] = "ulysses"
    devices: int = option(2, ge=1)

    def context_parallel_options(self) -> dict:
        return {"ulysses_degree": self.devices, "ulysses_anything": True}


@register
@dataclasses.dataclass(frozen=True)
class ParallelRing(SequenceParallelConfig):
    """The token sequence split over ``devices`` ranks, key/value chunks passed around the ring (ring attention).
    Needs an attention backend that returns the log-sum-exp (CUDA). Example: ``parallel(mode=ring,devices=2)``."""

    mode: Literal["ring"] = "ring"
    devices: int = option(2, ge=1)

    def context_parallel_options(self) -> dict:
        return {"ring_degree": self.devices, "ring_anything": True}

    def check_backend(self, backend: str, where: str) -> None:
        if backend in ("native", "_native_math", "_native_efficient", "_native_npu", "_native_xla", "flex"):
            raise AcceleratorError(
                f"{where}: diffusers' ring attention needs an attention backend that returns the log-sum-exp "
                f"(flash, _native_cudnn, sage: CUDA kernels); this model's attention uses {backend!r}, which does "
                "not. Use mode=ulysses, or set such a backend on a GPU (model.set_attention_backend)"
            )


def attention_processors(denoiser: torch.nn.Module) -> list:
    """The attention processors diffusers' context parallelism configures (those with ``_parallel_config``)."""
    found = []
    for module in denoiser.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_parallel_config") and processor not in found:
            found.append(processor)
    return found


def planned_transformers() -> list[str]:
    """diffusers' transformer classes that carry a context-parallel plan."""
    import diffusers

    return sorted(
        n for n in dir(diffusers) if n.endswith("Model") and getattr(getattr(diffusers, n, None), "_cp_plan", None)
    )


@contextlib.contextmanager
def _one_device_per_rank():
    # diffusers computes rank % torch.accelerator.device_count(), which is 0 on CPU: report one device there
    count = torch.accelerator.device_count
    if count() == 0:
        torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = count


def _undo(denoiser, hooked: dict, saved: list) -> None:
    for module, name in hooked.items():
        remove_hook(module, name)
    for processor, value in saved:
        if value is _MISSING:
            processor.__dict__.pop("_parallel_config", None)
        else:
            processor._parallel_config = value
    denoiser.__dict__.pop("_parallel_config", None)
