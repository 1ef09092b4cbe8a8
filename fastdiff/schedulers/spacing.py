"""The search space of schedule tuning: K integer timesteps as a point of an unconstrained parameter space.

``Spacing`` maps softmax logits of the log-sigma decrements to strictly decreasing integer timesteps and back;
``fastdiff.schedulers.tuning`` (noise schedules) and ``fastdiff.schedulers.tuning_flow`` (flow schedules) both
search over it.

Example::

    from fastdiff.schedulers.spacing import Spacing
    spacing = Spacing(pipe.scheduler, steps=6, free_start=True)
    timesteps = spacing.timesteps(spacing.theta([999, 800, 600, 400, 200, 0]))
"""

from __future__ import annotations

import numpy as np

from fastdiff.schedulers.tuned import sigma_table


def strictly_decreasing(timesteps, num_train_timesteps: int, pin_first: bool = True) -> list[int]:
    """Round, start at T-1 (``pin_first``) and make strictly decreasing integers >= 0 (distinct steps).

    >>> strictly_decreasing([999.2, 500.4, 500.1, 0.2], 1000)
    [999, 500, 499, 0]
    >>> strictly_decreasing([940.2, 500.4, 0.2], 1000, pin_first=False)
    [940, 500, 0]
    """
    steps = len(timesteps)
    ts = np.rint(np.asarray(timesteps, dtype=np.float64)).astype(np.int64)
    ts = np.clip(ts, steps - 1 - np.arange(steps), num_train_timesteps - 1 - np.arange(steps))
    if pin_first:
        ts[0] = num_train_timesteps - 1
    for i in range(1, steps):
        ts[i] = min(ts[i], ts[i - 1] - 1)
    return ts.tolist()


class Spacing:
    """Maps parameters theta (K logits, K+1 with a free start) to integer timesteps and back for one noise
    schedule and K."""

    def __init__(self, scheduler, steps: int, free_start: bool = False):
        self.steps, self.free_start = steps, free_start
        self.log_sigma = sigma_table(scheduler).double().log().numpy()  # increasing with t
        self.top, self.bottom = self.log_sigma[-1], self.log_sigma[0]

    def timesteps(self, theta: np.ndarray) -> list[int]:
        # Softmax shares the span of log-sigma among (a head gap below T-1,) K-1 decrements and a slack (the
        # gap to t=0).
        weights = np.exp(theta - theta.max())
        gaps = (self.top - self.bottom) * weights[:-1] / weights.sum()
        head = np.zeros(1) if not self.free_start else gaps[:1]
        decrements = gaps[1:] if self.free_start else gaps
        log_sigma = self.top - np.concatenate([head, head + np.cumsum(decrements)])
        return strictly_decreasing(self.to_t(log_sigma), len(self.log_sigma), pin_first=not self.free_start)

    def theta(self, timesteps: list[int]) -> np.ndarray:
        log_sigma = self.log_sigma[timesteps]
        parts = np.concatenate([-np.diff(log_sigma), [log_sigma[-1] - self.bottom]])
        if self.free_start:
            parts = np.concatenate([[self.top - log_sigma[0]], parts])
        return np.log(np.maximum(parts / (self.top - self.bottom), 1e-4))

    def to_t(self, log_sigma) -> np.ndarray:
        # Inverse of the table by linear interpolation of log-sigma, as diffusers' _sigma_to_t does.
        return np.interp(log_sigma, self.log_sigma, np.arange(len(self.log_sigma)))
