"""DMD2's adversarial term: a small classifier head on the fake score's middle features tells real training images
from the generator's, both noised at a random level; the fake score's update adds the head's loss, the
generator's adds the non-saturating loss of its own samples being called real (Yin et al. 2024, section 4.3).
The head is a one-layer MLP on every position of those features, averaged over positions, then a linear
readout that starts at zero ("undecided"); DMD2's own head is a stack of strided convolutions on a UNet's
bottleneck, which a transformer's tokens do not have. For a flow teacher the real samples are its training
split in latent space (``fastdiff.train.data.real_latents``, held by ``RealSamples``), read with the
unconditional input, or (``--gan-prompts``) each with a prompt of the training pool that names its label, as
DMD2 reads real images with their captions; the generator's samples are then read with their own prompts.

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
from fastdiff.train.data import take_rows


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


class RealSamples:
    """A flow teacher's training split for the head: latents and, with ``labels``, the conditioning each is read
    with (a row of ``cond``, the batches' pool, whose prompt names its label: ``named`` holds each row's label).

    ``draw(n, g)`` returns (latents, their conditioning or None: read with the unconditional input)."""

    def __init__(self, latents: torch.Tensor, labels=None, named: list[int] | None = None, cond=None):
        self.latents, self.labels, self.cond = latents, labels, cond
        self.conditional = labels is not None
        if self.conditional:
            missing = sorted(set(labels.tolist()) - set(named or []))
            if missing:
                raise DistillError(f"--gan-prompts: no prompt of the training pool names the labels {missing}")
            rows = [[i for i, y in enumerate(named) if y == label] for label in range(int(labels.max()) + 1)]
            self.counts = torch.tensor([len(r) for r in rows])
            self.table = torch.tensor([r + [0] * (max(map(len, rows)) - len(r)) for r in rows])
            self.pool = len(named)

    def draw(self, n: int, g: torch.Generator):
        idx = torch.randint(0, self.latents.shape[0], (n,), generator=g)
        if not self.conditional:
            return self.latents[idx], None
        labels = self.labels[idx]
        pick = (torch.rand(n, generator=g) * self.counts[labels]).long()  # one of the rows naming each label
        return self.latents[idx], take_rows(self.cond, self.table[labels, pick], self.pool)


def discriminator_loss(real_logits: torch.Tensor, fake_logits: torch.Tensor) -> torch.Tensor:
    return F.softplus(-real_logits).mean() + F.softplus(fake_logits).mean()


def generator_loss(fake_logits: torch.Tensor) -> torch.Tensor:
    return F.softplus(-fake_logits).mean()


__all__ = ["GanHead", "RealSamples", "middle_module", "discriminator_loss", "generator_loss"]
