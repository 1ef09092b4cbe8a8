"""XLA compile and execute counts and times, from ``torch_xla.debug.metrics``.

``CompileTime`` counts real XLA compilations (a graph seen before is served from the cache and not
counted), ``ExecuteTime`` every graph run; both are process-wide and only grow.

Example::

    from fastdiff.xla.metrics import snapshot, since
    before = snapshot()
    fp(prompt="a fox", num_inference_steps=4)
    print(since(before))  # {"compiles": 0, "compile_s": 0.0, "executions": 9, "execute_s": 0.05, ...}
"""

from __future__ import annotations

from fastdiff.xla.device import require_torch_xla

# (our name, torch_xla metric name); each metric gives a count and a total time in nanoseconds.
TIMED = (("compile", "CompileTime"), ("execute", "ExecuteTime"))


def snapshot() -> dict[str, float]:
    """Process-wide totals now: compiles, compile_s, executions, execute_s."""
    require_torch_xla()
    import torch_xla.debug.metrics as met

    out: dict[str, float] = {}
    for name, metric in TIMED:
        data = met.metric_data(metric)
        count, total_ns = (data[0], data[1]) if data else (0, 0.0)
        plural = "compiles" if name == "compile" else "executions"
        out[plural] = int(count)
        out[f"{name}_s"] = float(total_ns) / 1e9
    return out


def since(before: dict[str, float]) -> dict[str, float]:
    """What happened after ``before`` (a :func:`snapshot`)."""
    now = snapshot()
    return {k: (now[k] - before.get(k, 0)) for k in now}


def format_metrics(metrics: dict[str, float]) -> str:
    """One line: 'XLA: 3 compiles (12.1 s), 240 executions (1.9 s)'."""
    return (
        f"XLA: {metrics['compiles']} compiles ({metrics['compile_s']:.2f} s), "
        f"{metrics['executions']} executions ({metrics['execute_s']:.2f} s)"
    )
