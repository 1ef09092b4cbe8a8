"""The losses of ``fastdiff distill dmd``: DMD2's distribution-matching gradient or SiD's score-identity loss
for the generator, the fake score's denoising loss, and the optional regression to the teacher's ODE samples.

Written for any ``fastdiff.distill.process`` (diffusion or flow): the denoisers are read through it, so one
code path serves epsilon, v and flow-velocity teachers, UNets and transformers (``key`` names the sample input).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastdiff.distill.dmd_gan import discriminator_loss, generator_loss
from fastdiff.train.inputs import denoiser_output, to_device


def guided_x0(process, model, key, x_t, levels, cond, uncond, scale: float):
    """x0 of ``model`` at ``x_t`` and ``levels``, classifier-free guided at ``scale`` when ``uncond`` is given."""
    timestep = process.timestep(levels).to(x_t.device)
    x0 = process.x0(denoiser_output(model, {key: x_t, "timestep": timestep, **cond})[:, : x_t.shape[1]], x_t, levels)
    if uncond is None or scale == 1:
        return x0
    out = denoiser_output(model, {key: x_t, "timestep": timestep, **uncond})[:, : x_t.shape[1]]
    x0_u = process.x0(out, x_t, levels)
    return x0_u + scale * (x0 - x0_u)


def generate(process, gen, key, z, cond):
    """The generator's one-call sample from pure noise ``z``."""
    timestep = process.generator_timestep(z.shape[0]).to(z.device)
    return process.generator_x0(denoiser_output(gen, {key: z, "timestep": timestep, **cond})[:, : z.shape[1]], z)


def teacher_pairs(process, teacher, batches, key, scale, count, steps, seed, path) -> dict:
    """``count`` (noise, teacher sample, conditioning) pairs by ``steps`` deterministic (DDIM / flow Euler) steps
    of the guided teacher, saved to ``path`` once and reused on resume."""
    if path.is_file():
        return torch.load(path, weights_only=False)
    g = torch.Generator().manual_seed(seed + 7919)
    levels = process.ode_levels(steps)
    noises, samples, conds = [], [], []
    for _ in range(-(-count // batches.size)):
        _, cond, uncond = batches.batch(g)
        z = torch.randn((batches.size, *batches.shape), generator=g)
        x = z
        with torch.no_grad():
            for i, level in enumerate(levels):
                now = torch.full((z.shape[0],), int(level))
                x0 = guided_x0(process, teacher, key, x, now, cond, uncond if scale > 1 else None, scale)
                if i + 1 == len(levels):
                    x = x0
                else:
                    x = process.noise(x0, process.noise_from(x, x0, now), torch.full_like(now, int(levels[i + 1])))[0]
        noises.append(z)
        samples.append(x)
        conds.append(cond)
    pairs = {
        "noise": torch.cat(noises)[:count],
        "sample": torch.cat(samples)[:count],
        "cond": {
            k: torch.cat([c[k] for c in conds])[:count] if torch.is_tensor(conds[0][k]) else conds[0][k]
            for k in conds[0]
        },
    }
    torch.save(pairs, path)
    return pairs


def fake_steps_done(fake_opt) -> int:
    """How many updates the fake score's optimizer has made (its own checkpointed state: exact on resume)."""
    steps = [state["step"] for state in fake_opt.state.values() if "step" in state]
    return int(max(steps)) if steps else 0


def dmd_loss_fn(
    process,
    key,
    batches,
    teacher,
    fake,
    fake_opt,
    scale,
    low,
    high,
    fake_updates,
    method,
    sid_alpha,
    regression,
    pool,
    fake_warmup: int = 0,
    gan=None,
    gan_weight: float = 0.0,
    gan_d_weight: float = 0.0,
    real_split=None,
):
    """``loss_fn(generator, g, device)`` for ``fastdiff.train.loop.train``: ``fake_updates`` fake-score steps on
    fresh generator samples, then the generator's loss (and the losses shown beside it). Until the fake score
    has made ``fake_warmup`` updates the generator's loss is zero: it waits for the fake score to follow it.
    With ``gan`` (a ``fastdiff.distill.dmd_gan.GanHead`` on the fake score) the fake score's loss adds
    ``gan_d_weight`` x the head's real/fake loss on the batch's training images, the generator's ``gan_weight`` x
    the non-saturating loss of its samples. ``real_split`` (a ``RealSamples``: training samples not paired with the
    batches' conditioning, a flow teacher's) gives the real samples; unless it gives their conditioning too, the
    head reads real and generated samples with the unconditional input."""
    total = process.total

    def levels_between(n, lo, hi, g, device):
        return torch.randint(lo, hi + 1, (n,), generator=g).to(device)

    def fresh(gen, g, device, cond):
        return generate(process, gen, key, torch.randn((batches.size, *batches.shape), generator=g).to(device), cond)

    def loss_fn(gen, g, device):
        x_real, cond, uncond = batches.batch(g)
        conditional = real_split is None or real_split.conditional  # the head reads each sample's own conditioning
        head_cond = to_device(cond if conditional else uncond, device) if gan is not None else None
        real_cond = head_cond
        cond, uncond = to_device(cond, device), (to_device(uncond, device) if scale > 1 else None)
        fake_losses, head_losses = [], []
        for _ in range(fake_updates):  # the fake score follows the generator (two time-scale)
            with torch.no_grad():
                x_g = fresh(gen, g, device, cond)
            levels = levels_between(x_g.shape[0], 0, total - 1, g, device)
            noise = torch.randn(x_g.shape, generator=g).to(device)
            x_t, timestep = process.noise(x_g, noise, levels)
            inputs = {key: x_t, "timestep": timestep, **cond}
            if gan is not None and conditional:  # the head reads the generated samples within the same call
                fake_logits, out = gan.logits(denoiser_output, fake, inputs)
            else:
                out = denoiser_output(fake, inputs)
                if gan is not None:  # a flow teacher's: the head reads them with the unconditional input
                    fake_logits, _ = gan.logits(denoiser_output, fake, {key: x_t, "timestep": timestep, **head_cond})
            f_loss = F.mse_loss(out[:, : x_t.shape[1]], process.target(x_g, noise, levels))
            if gan is not None:  # the head: the batch's training images, noised alike, are real
                if real_split is not None:
                    x_real, drawn = real_split.draw(x_g.shape[0], g)
                    real_cond = head_cond if drawn is None else to_device(drawn, device)
                real_noise = torch.randn(x_g.shape, generator=g).to(device)
                real_t, real_ts = process.noise(x_real.to(device), real_noise, levels)
                real_logits, _ = gan.logits(denoiser_output, fake, {key: real_t, "timestep": real_ts, **real_cond})
                head_loss = discriminator_loss(real_logits, fake_logits)
                head_losses.append(head_loss.item())
                f_loss = f_loss + gan_d_weight * head_loss
            fake_opt.zero_grad(set_to_none=True)
            f_loss.backward()
            fake_opt.step()
            fake_losses.append(f_loss.item())
        if fake_steps_done(fake_opt) < fake_warmup:
            x_g = fresh(gen, g, device, cond)
            return 0.0 * x_g.sum(), {"fake": sum(fake_losses) / len(fake_losses), "warmup": 1.0}
        fake.requires_grad_(False)
        try:
            x_g = fresh(gen, g, device, cond)
            levels = levels_between(x_g.shape[0], low, high, g, device)
            noise = torch.randn(x_g.shape, generator=g).to(device)
            dims = tuple(range(1, x_g.dim()))
            if method == "dmd":
                with torch.no_grad():
                    x_t = process.noise(x_g.detach(), noise, levels)[0]
                    real = guided_x0(process, teacher, key, x_t, levels, cond, uncond, scale)
                    fake_x0 = guided_x0(process, fake, key, x_t, levels, cond, None, 1.0)
                    norm = (x_g - real).abs().mean(dim=dims, keepdim=True).clamp_min(1e-5)
                    grad = torch.nan_to_num((fake_x0 - real) / norm)
                loss = 0.5 * F.mse_loss(x_g, (x_g - grad).detach())
            else:  # SiD: through both denoisers' inputs, their weights fixed
                x_t = process.noise(x_g, noise, levels)[0]
                real = guided_x0(process, teacher, key, x_t, levels, cond, uncond, scale)
                fake_x0 = guided_x0(process, fake, key, x_t, levels, cond, None, 1.0)
                with torch.no_grad():
                    norm = (x_g - real).abs().mean(dim=dims, keepdim=True).clamp_min(1e-5)
                gap = real - fake_x0
                loss = (gap * ((real - x_g) - sid_alpha * gap) / norm).mean()
            if gan is not None:
                levels = levels_between(x_g.shape[0], low, high, g, device)
                x_t, timestep = process.noise(x_g, torch.randn(x_g.shape, generator=g).to(device), levels)
                logits, _ = gan.logits(denoiser_output, fake, {key: x_t, "timestep": timestep, **head_cond})
                adversarial = generator_loss(logits)
        finally:
            fake.requires_grad_(True)
        shown = {"fake": sum(fake_losses) / len(fake_losses), method: loss.item()}
        if gan is not None:
            shown["gan"], shown["head"] = adversarial.item(), sum(head_losses) / len(head_losses)
            loss = loss + gan_weight * adversarial
        if pool is not None:
            i = torch.randint(0, pool["noise"].shape[0], (batches.size,), generator=g)
            pc = to_device({k: v[i] if torch.is_tensor(v) else v for k, v in pool["cond"].items()}, device)
            reg = F.mse_loss(
                generate(process, gen, key, pool["noise"][i].to(device), pc), pool["sample"][i].to(device)
            )
            shown["regression"] = reg.item()
            loss = loss + regression * reg
        return loss, shown

    return loss_fn
