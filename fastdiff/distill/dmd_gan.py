"""DMD2's adversarial term: a small classifier head on the fake score's middle features tells real training images
from the generator's, both noised at a random level; the fake score's update adds the head's loss, the
generator's adds the non-saturating loss of its own samples being called real (Yin et al. 2024, section 4.3).
The head is a one-layer MLP on every position of those features, averaged over positions, then a linear
readout that starts at zero ("undecided"); DMD2's own head is a stack of strided convolutions on a UNet's
bottleneck, which a transformer's tokens do not have. For a flow teacher the real samples are its training
split in latent space (``fastdiff.train.data.real_latents``), read with the unconditional input.

The features are read by a named forward hook on the fake score's middle module (a UNet's ``mid_block``, a
transformer's middle block) that records only while ``capture()`` is open, so the same module can serve the
other roles of a LoRA base untouched. The head is trained by the fake score's optimizer and checkpointed with it.

Example::

    gan = GanHead(fake, probe_inputs, seed=0)               # probe_inputs: one call's denoiser inputs
    fake_logits, output = gan.logits(denoiser_output, fake, inputs)
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from fastdiff.core.denoisers import block_io, denoiser_facts
from fastdiff.distill.common import DistillError


def middle_module(denoiser) -> tuple[torch.nn.Module, int | None]:
    """(module, place of the image states in its output tuple): a UNet's ``mid_block`` (None: it returns a
    tensor), or the middle block of a transformer's first block list (the per-model facts);
    UnsupportedModelError for a denoiser without facts."""
    facts = denoiser_facts(denoiser, "dmd --gan")
    if facts.family == "unet":
        return denoiser.mid_block, None
    blocks = getattr(denoiser, facts.blocks[0])
    middle = blocks[len(blocks) // 2]
    return middle, block_io(middle).return_hidden_states_index


def _positions(output, index: int | None) -> torch.Tensor:
    """(batch, positions, features): the image states of a block's output (``index``: their place in a tuple)."""
    if isinstance(output, (tuple, list)):
        output = output[index or 0]
    return output.flatten(2).transpose(1, 2) if output.dim() == 4 else output


class GanHead(torch.nn.Module):
    """A real/fake classifier on the middle features of ``denoiser`` (sized by one probe call): an MLP per
    position (initialised from ``seed``), averaged, then a linear readout that starts at logit 0."""

    def __init__(self, denoiser, probe: dict, seed: int = 0):
        super().__init__()
        self._features: list[torch.Tensor] = []
        self._recording = False
        # a LoRA view (fastdiff.distill.dmd_lora) holds its base; the probe runs through the view itself
        middle, self._index = middle_module(getattr(denoiser, "base", denoiser))
        self._hook = middle.register_forward_hook(self._record)
        with torch.no_grad(), self.capture():
            type(denoiser).forward(denoiser, **probe, return_dict=False)
            width = self._features[-1].shape[-1]
        self.mlp = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.SiLU())
        self.readout = torch.nn.Linear(width, 1)
        g = torch.Generator().manual_seed(seed)  # its own generator: a resumed run builds the same head
        with torch.no_grad():
            self.mlp[0].weight.copy_(torch.randn(width, width, generator=g) / math.sqrt(width))
            self.mlp[0].bias.zero_()
            self.readout.weight.zero_()  # start at "undecided" (logit 0), as a fresh head should
            self.readout.bias.zero_()

    def _record(self, module, args, output):
        if self._recording:
            self._features.append(_positions(output, self._index))

    @contextlib.contextmanager
    def capture(self):
        self._recording, self._features = True, []
        try:
            yield self
        finally:
            self._recording, self._features = False, []

    def logits(self, call, *args):
        """(logits, output): run ``call(*args)`` (one fake-score call) and classify the features it recorded."""
        with self.capture():
            output = call(*args)
            if len(self._features) != 1:
                raise DistillError(f"--gan: the middle block ran {len(self._features)} times in one call")
            return self.readout(self.mlp(self._features[0].float()).mean(1)).squeeze(-1), output

    def remove(self) -> None:
        self._hook.remove()


def discriminator_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    return F.softplus(-real_logits).mean() + F.softplus(fake_logits).mean()


def generator_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    return F.softplus(-fake_logits).mean()


__all__ = ["GanHead", "middle_module", "discriminator_loss", "generator_loss"]
