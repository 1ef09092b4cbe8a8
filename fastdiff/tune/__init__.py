"""``fastdiff tune``: the fastest accelerator setting within a quality budget, and the Pareto frontier.

- ``budget.py``: ``"accuracy>=-1 point"``, ``"fd<=1.2x"``, ``"psnr>=35"``, relative to a baseline config;
- ``space.py``: search spaces (sampler x steps x accelerator options, models such as distilled students) as
  YAML-able data, with a default per model family (digits, unet, dit, samplers);
- ``measure.py``: one candidate measured with ``fastdiff bench``'s ``run_bench``, cached on disk;
- ``search.py``: grid or successive halving, the frontier and the answer, all on the selection seed;
- ``report.py``: the baseline, the answer and the frontier measured again on the report seed, with each
  budget's verdict there.

Example::

    from fastdiff import FastPipeline
    from fastdiff.tune import tune

    result = tune("/tmp/digits", ["accuracy>=-1 point"], cache_dir="/tmp/tune-cache", seed=0, report_seed=1)
    print(result["report"]["within_budget"])  # does the pick still meet the budget on the report seed?
    fp = FastPipeline.from_pretrained("/tmp/digits", accelerators=result["best"]["spec"])
"""

from fastdiff.tune.budget import Budget, BudgetError, parse_budget, parse_budgets
from fastdiff.tune.search import pareto, side_by_side, tune
from fastdiff.tune.space import Space, SpaceError, default_space, load_space

__all__ = [
    "Budget",
    "BudgetError",
    "parse_budget",
    "parse_budgets",
    "tune",
    "pareto",
    "side_by_side",
    "Space",
    "SpaceError",
    "default_space",
    "load_space",
]
