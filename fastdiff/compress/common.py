"""What the structure-changing accelerators share: size counts, the hooked-blocks check, Taylor gradients, and
the copies that pruning works on.

``prune`` (UNets), ``prune_dit`` (transformers) and ``lowrank`` import these; ``recover`` sits above them all.

Example::

    from fastdiff.compress.common import count_params_macs
    from fastdiff.train.inputs import capture_inputs

    params, macs = count_params_macs(fp.denoiser, capture_inputs(fp, batch=1))
"""

from __future__ import annotations

import copy
import logging

import torch
from torch import nn

from fastdiff.core.diffusers_compat import hook_registry
from fastdiff.core.hooks import Handle
from fastdiff.core.registry import AcceleratorError
from fastdiff.train.inputs import denoiser_output, noised_inputs


def count_params_macs(module: nn.Module, inputs: dict) -> tuple[int, int]:
    """(parameters, multiply-accumulates of one call on ``inputs``) counted by torch's FlopCounterMode.

    The call runs on fake tensors (shapes only, no arithmetic): the same count in a fraction of a second at any
    size (a real call of a full-size video denoiser at its default clip takes hours on a CPU). A model whose
    forward needs real values (data-dependent shapes) is counted on a real call instead."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode

    params = sum(p.numel() for p in module.parameters())
    forward = type(module).forward  # the class forward: the wrapper's hooks must not count it
    try:
        with (
            torch.no_grad(),
            FakeTensorMode(allow_non_fake_inputs=True),
            FlopCounterMode(display=False) as counter,
        ):
            forward(module, **inputs)
    except (RuntimeError, NotImplementedError):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            forward(module, **inputs)
    return params, counter.get_total_flops() // 2


def sized_handle(restore, module: nn.Module, inputs: dict, before: tuple[int, int], **info) -> Handle:
    """A Handle that reports ``params_before/after`` and ``macs_before/after`` (``before``: counted earlier)."""
    params, macs = count_params_macs(module, inputs)
    return Handle(
        restore, params_before=before[0], params_after=params, macs_before=before[1], macs_after=macs, **info
    )


def refuse_hooked_blocks(den, accelerator: str) -> None:
    """AcceleratorError if another accelerator hooks the denoiser's submodules (they would be replaced)."""
    for name, m in den.named_modules():
        registry = hook_registry(m)
        if m is not den and registry is not None and registry.hooks:
            raise AcceleratorError(
                f"{accelerator}: {name} is hooked by {', '.join(registry.hooks)}; apply {accelerator} first "
                "(in the same accelerate call, or before the others)"
            )


class PruningCopies:
    """Swap ``den``'s children for copies that share the originals' parameters and buffers.

    A deep copy would hold the whole model twice while pruning runs (SDXL's UNet: 10.3 GB more in fp32).
    torch-pruning replaces each tensor it prunes with a new one and never writes into it, so sharing leaves the
    originals exact. ``finish()`` then gives the copies their own copy of every tensor pruning left as it was
    (training the pruned model leaves the originals alone), and puts the originals' ``requires_grad`` and
    ``grad`` back. ``restore()`` puts the original children back.
    """

    def __init__(self, den: nn.Module):
        self.den, self.originals = den, dict(den.named_children())
        params = [p for child in self.originals.values() for p in child.parameters()]
        tensors = params + [b for child in self.originals.values() for b in child.buffers()]
        self.before = {p: (p.requires_grad, p.grad) for p in params}
        self.shared = {id(t) for t in tensors}  # stable ids: the originals keep these tensors alive
        memo = {id(t): t for t in tensors}  # deepcopy returns these tensors themselves
        for name, child in self.originals.items():
            setattr(den, name, copy.deepcopy(child, memo))

    def _reset_originals(self) -> None:
        for p, (flag, grad) in self.before.items():
            p.requires_grad_(flag)
            p.grad = grad

    def finish(self) -> None:
        for m in self.den.modules():
            for store in (m._parameters, m._buffers):
                for key, t in store.items():
                    if t is not None and id(t) in self.shared:
                        own = t.detach().clone()
                        store[key] = nn.Parameter(own, t.requires_grad) if isinstance(t, nn.Parameter) else own
        self._reset_originals()

    def restore(self) -> None:
        for name, child in self.originals.items():
            setattr(self.den, name, child)
        self._reset_originals()


def trace_inputs(den: nn.Module, inputs: dict) -> dict:
    """One sample of the captured inputs, its latent cropped to the smallest side the UNet downsamples whole.

    torch-pruning traces the graph only for its structure, which neither the batch nor the latent size changes;
    the captured batch (both guidance branches at the native size) makes that trace hold GBs of activations
    (SD 1.5 at 512 px: about 7 GB).
    """
    batch = inputs["sample"].shape[0]
    # twice the total downsampling: every level sees 2 x 2 or more
    side = 2 ** len(den.config.down_block_types)

    def one(value):
        if isinstance(value, dict):
            return {k: one(v) for k, v in value.items()}
        if torch.is_tensor(value) and value.dim() and value.shape[0] == batch:
            return value[:1]
        return value

    small = one(inputs)
    small["sample"] = small["sample"][..., :side, :side]
    return small


def taylor_gradients(den, fp, inputs: dict, batches: int = 4) -> None:
    """Accumulate denoising-loss gradients (noised random samples, the pipeline's own conditioning)."""
    den.zero_grad(set_to_none=True)
    generator = torch.Generator().manual_seed(0)
    for _ in range(batches):
        noisy, target = noised_inputs(fp.pipe.scheduler.config, inputs, generator=generator)
        out = denoiser_output(den, noisy)[:, : target.shape[1]]
        (nn.functional.mse_loss(out, target) / batches).backward()


def config_mismatch(den) -> str | None:
    """None if ``type(den).from_config(den.config)`` builds this structure, else what differs."""
    from diffusers.utils import logging as dlogging

    level = dlogging.get_verbosity()
    dlogging.set_verbosity(logging.ERROR)
    try:
        with torch.device("meta"):
            fresh = type(den).from_config(den.config)
    except ValueError as exc:  # e.g. GroupNorm divisibility
        return f"from_config fails: {exc}"
    finally:
        dlogging.set_verbosity(level)
    want = {k: tuple(v.shape) for k, v in den.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    bad = sorted(k for k in want.keys() | got.keys() if want.get(k) != got.get(k))
    if bad:
        return f"{len(bad)} tensors, e.g. {bad[0]}: {want.get(bad[0])} here, {got.get(bad[0])} from config"
    heads = [(n, m.heads) for n, m in den.named_modules() if hasattr(m, "heads")]
    fresh_heads = [(n, m.heads) for n, m in fresh.named_modules() if hasattr(m, "heads")]
    return None if heads == fresh_heads else "attention head counts"
