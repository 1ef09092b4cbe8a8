"""Quality budgets for the tuner: ``"accuracy>=-0.01"``, ``"accuracy >= -1 point"``, ``"fd<=1.2x"``, ``"psnr>=35"``.

A budget is ``METRIC OP VALUE[UNIT]`` and is judged against the baseline config's measurement:

- ``1.2x`` (a number with ``x``): at most / at least that multiple of the baseline's value (``fd<=1.2x``);
- ``-1 point`` / ``-1 points`` / ``-1pt``: a change in percentage points from the baseline (fraction metrics
  such as accuracy: ``accuracy>=-1 point`` means at most one point below the baseline);
- a signed number (``-0.01``, ``+0``): a change from the baseline in the metric's own units;
- ``97%``: an absolute value in percent; a plain number: an absolute value (``psnr>=35`` dB).

PSNR and SSIM are measured against the baseline's own images, so they take absolute values only (the baseline
itself counts as identical: PSNR inf, SSIM 1). Several budgets must all hold.

Example::

    from fastdiff.tune.budget import parse_budget

    budget = parse_budget("accuracy >= -1 point")
    budget.holds({"accuracy": 0.985}, {"accuracy": 0.99})   # True: half a point below the baseline
    str(parse_budget("fd<=1.2x"))                            # 'fd<=1.2x'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# metric -> (better direction, what it is); metrics fastdiff bench reports
METRICS: dict[str, tuple[str, str]] = {
    "accuracy": ("higher", "digits classifier agreement with the requested label (fraction)"),
    "fd": ("lower", "Frechet distance of classifier features vs the test images"),
    "psnr": ("higher", "PSNR vs the baseline's images (dB)"),
    "ssim": ("higher", "SSIM vs the baseline's images"),
    "ode_error": ("lower", "mean L2 distance to the exact ODE solution (exact-score model)"),
}
VS_BASELINE = ("psnr", "ssim")  # measured against the baseline's images: absolute thresholds only
IDENTICAL = {"psnr": math.inf, "ssim": 1.0}  # the baseline compared with itself

_BUDGET = re.compile(
    r"^\s*(?P<metric>[A-Za-z_]\w*)\s*(?P<op>>=|<=|=>|=<|>|<)\s*(?P<value>[+-]?\s*(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)"
    r"\s*(?P<unit>x|%|points?|pts?)?\s*$",
    re.I,
)


class BudgetError(ValueError):
    """A budget string that cannot be understood, naming the problem."""


@dataclass(frozen=True)
class Budget:
    """``metric op value`` where ``mode`` is ``absolute``, ``delta`` (vs baseline) or ``ratio`` (vs baseline)."""

    metric: str
    op: str  # ">=" or "<="
    value: float
    mode: str
    text: str

    def threshold(self, baseline: dict) -> float:
        """The absolute value a candidate must reach, given the baseline's measurement."""
        if self.mode == "absolute":
            return self.value
        base = _value(baseline, self.metric)
        if base is None:
            raise BudgetError(f"budget {self.text!r}: the baseline has no {self.metric!r} measurement")
        if self.mode == "ratio":
            return self.value * base
        return base + self.value

    def margin(self, row: dict, baseline: dict, slack: float = 0.0) -> float | None:
        """How far ``row`` is inside the budget (>= 0: it holds), in the metric's units; None: not measured.

        ``slack`` loosens the threshold (in the metric's units, or as a multiplier for ratio budgets) for
        measurements on fewer images than the final one.
        """
        value = _value(row, self.metric)
        if value is None:
            return None
        limit = self.threshold(baseline)
        if self.op == ">=":
            return value - (limit - slack)
        if self.mode == "ratio" or self.metric in ("fd", "ode_error"):
            return limit * (1 + slack) - value
        return limit + slack - value

    def holds(self, row: dict, baseline: dict, slack: float = 0.0) -> bool:
        margin = self.margin(row, baseline, slack)
        return margin is not None and margin >= 0

    def __str__(self) -> str:
        return self.text


def _value(row: dict, metric: str) -> float | None:
    value = row.get(metric)
    if value is None and row.get("is_baseline") and metric in IDENTICAL:
        return IDENTICAL[metric]
    return None if value is None else float(value)


def parse_budget(text: str) -> Budget:
    """Parse one budget string; raise BudgetError naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise BudgetError(f"empty budget {text!r}; expected e.g. 'accuracy>=-1 point', 'fd<=1.2x' or 'psnr>=35'")
    match = _BUDGET.match(text)
    if not match:
        raise BudgetError(
            f"cannot read budget {text!r}: expected METRIC >= or <= VALUE, with VALUE a number, optionally "
            "followed by x (times the baseline), point(s) (percentage points vs the baseline) or % "
            "(e.g. 'accuracy>=-1 point', 'fd<=1.2x', 'psnr>=35')"
        )
    metric = match["metric"].lower()
    if metric not in METRICS:
        raise BudgetError(f"budget {text!r}: unknown metric {metric!r}; known: {', '.join(METRICS)}")
    op = {"=>": ">=", "=<": "<=", ">": ">=", "<": "<="}.get(match["op"], match["op"])
    raw = match["value"].replace(" ", "")
    value, unit = float(raw), (match["unit"] or "").lower()
    signed = raw[0] in "+-"
    if unit == "x":
        mode = "ratio"
        if value <= 0:
            raise BudgetError(f"budget {text!r}: a ratio to the baseline must be positive, got {value}x")
    elif unit.startswith("p"):
        mode, value = "delta", value / 100
    elif unit == "%":
        mode, value = "absolute", value / 100
    else:
        mode = "delta" if signed else "absolute"
    if metric in VS_BASELINE and mode != "absolute":
        raise BudgetError(
            f"budget {text!r}: {metric} is measured against the baseline's images already; give an absolute "
            f"value (e.g. '{metric}>={35 if metric == 'psnr' else 0.95}')"
        )
    direction = METRICS[metric][0]
    if (direction == "higher") != (op == ">="):
        raise BudgetError(
            f"budget {text!r}: {metric} is better when {direction}, so its budget is a "
            f"{'lower' if direction == 'higher' else 'upper'} bound ({metric} {'>=' if direction == 'higher' else '<='} ...)"
        )
    return Budget(metric, op, value, mode, f"{metric}{op}{_format(value, mode, unit)}")


def _format(value: float, mode: str, unit: str) -> str:
    if mode == "ratio":
        return f"{value:g}x"
    if unit.startswith("p"):
        return f"{value * 100:+g} point{'s' if abs(value * 100) != 1 else ''}"
    if mode == "delta":
        return f"{value:+g}"
    return f"{value * 100:g}%" if unit == "%" else f"{value:g}"


def parse_budgets(texts) -> list[Budget]:
    """Parse a list of budgets (each item may join several with ',' or ' and ')."""
    if isinstance(texts, str):
        texts = [texts]
    budgets = []
    for item in texts:
        for part in re.split(r",|\band\b", item):
            if part.strip():
                budgets.append(parse_budget(part))
    if not budgets:
        raise BudgetError("give at least one budget, e.g. --budget 'accuracy>=-1 point'")
    return budgets


def slack_for(budget: Budget, images: int, full_images: int, baseline: dict) -> float:
    """Loosening of ``budget`` for a screening measurement on ``images`` of ``full_images`` (0 at full size).

    Screening rungs only rank candidates; the final decision is always made on the full measurement. The
    slack is about two standard errors: for fractions (accuracy) of the binomial difference of two runs, for
    FD / ODE error a relative ``3/sqrt(images)``, for PSNR 1 dB and for SSIM 0.01.
    """
    if images >= full_images:
        return 0.0
    metric = budget.metric
    if metric == "accuracy":
        p = max(1 - (_value(baseline, "accuracy") or 0.98), 0.02)
        return 2 * math.sqrt(2 * p * (1 - p) / images)
    if metric in ("fd", "ode_error"):
        return 3 / math.sqrt(images)
    return {"psnr": 1.0, "ssim": 0.01}[metric]
