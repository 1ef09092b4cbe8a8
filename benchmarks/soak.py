"""A bounded soak of ``fastdiff serve``: a fixed request rate of mixed valid and invalid requests for a fixed time
against one real server on loopback (the shipped digits model, dpm++2m 10 steps, one torch thread).

    python benchmarks/soak.py --minutes 10 --rate 4     # make soak: results/soak.json

Requests are sent open-loop (one every 1/rate s, whatever the answers' timing): 70% valid (label, seed, count
1-2), 30% invalid in eight ways (broken JSON, non-UTF-8, out-of-range fields, unknown fields, a bool label,
steps over the limit, an oversized body, a PNG request for two images). Reported: requests sent, answered and
lost (no HTTP answer), statuses, 5xx count, valid requests' p50/p99 latency, and the server's resident memory
(psutil, every 5 s) after the first minute and at the end. Targets: 0 lost, 0 5xx, memory growth <= 5%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from datetime import date
from pathlib import Path

import httpx
import psutil
from serve_load import Server  # benchmarks/serve_load.py: fastdiff serve in a subprocess

from fastdiff.eval.record import write_record

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
INVALID = {  # name -> (body bytes, headers)
    "broken-json": (b'{"label": 3,', {}),
    "not-utf8": (b'{"label": 3, "profile": "\xff\xfe"}', {}),
    "label-range": (b'{"label": 12}', {}),
    "unknown-field": (b'{"label": 3, "model_path": "/etc/passwd"}', {}),
    "bool-label": (b'{"label": true}', {}),
    "steps-limit": (b'{"label": 3, "steps": 100000}', {}),
    "oversized": (b'{"label": 3, "pad": "' + b"x" * 40_000 + b'"}', {}),
    "png-count": (b'{"label": 3, "count": 2}', {"Accept": "image/png"}),
}


async def soak(url: str, pid: int, minutes: float, rate: float, seed: int) -> dict:
    rng = random.Random(seed)
    process = psutil.Process(pid)
    outcomes: list[tuple[str, str, float]] = []  # (kind, status or error, seconds)
    memory: list[tuple[float, int]] = []
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(kind: str, body: bytes, headers: dict) -> None:
            started = time.perf_counter()
            try:
                r = await client.post(
                    f"{url}/v1/generate", content=body, headers={"Content-Type": "application/json", **headers}
                )
                status = str(r.status_code)
            except httpx.HTTPError as error:
                status = type(error).__name__
            outcomes.append((kind, status, time.perf_counter() - started))

        async def sample_memory(start: float, end: float) -> None:
            while time.perf_counter() < end:
                memory.append((time.perf_counter() - start, process.memory_info().rss))
                await asyncio.sleep(5)

        start = time.perf_counter()
        end = start + 60 * minutes
        sampler = asyncio.create_task(sample_memory(start, end))
        tasks, sent = [], 0
        while (now := time.perf_counter()) < end:
            if rng.random() < 0.7:
                body = {
                    "label": rng.randrange(10),
                    "seed": rng.randrange(2**31),
                    "count": rng.choice((1, 1, 2)),
                }
                tasks.append(asyncio.create_task(one("valid", json.dumps(body).encode(), {})))
            else:
                name = rng.choice(sorted(INVALID))
                tasks.append(asyncio.create_task(one(name, *INVALID[name])))
            sent += 1
            await asyncio.sleep(max(0.0, start + sent / rate - now))
        await asyncio.gather(*tasks)
        await sampler
    return summarize(outcomes, memory, sent, minutes, rate)


def summarize(outcomes, memory, sent: int, minutes: float, rate: float) -> dict:
    statuses: dict[str, dict[str, int]] = {}
    for kind, status, _ in outcomes:
        statuses.setdefault(kind, {}).setdefault(status, 0)
        statuses[kind][status] += 1
    answered = [o for o in outcomes if o[1].isdigit()]
    ok = sorted(t for kind, status, t in outcomes if kind == "valid" and status == "200")
    after_minute = [rss for t, rss in memory if t >= 60] or [rss for _, rss in memory]
    growth = after_minute[-1] / after_minute[0] - 1 if after_minute else None
    return {
        "minutes": minutes,
        "rate_per_s": rate,
        "sent": sent,
        "answered": len(answered),
        "lost": sent - len(answered),
        "server_errors_5xx": sum(s.startswith("5") for _, s, _ in answered),
        "valid_not_200": sum(1 for k, s, _ in outcomes if k == "valid" and s != "200"),
        "invalid_not_4xx": sum(1 for k, s, _ in outcomes if k != "valid" and not s.startswith("4")),
        "statuses": statuses,
        "valid_p50_s": _pct(ok, 0.5),
        "valid_p99_s": _pct(ok, 0.99),
        "rss_mb_at_1min": round(after_minute[0] / 2**20, 1) if after_minute else None,
        "rss_mb_end": round(after_minute[-1] / 2**20, 1) if after_minute else None,
        "rss_growth_after_1min": None if growth is None else round(growth, 4),
        "rss_mb_samples": [(round(t), round(rss / 2**20, 1)) for t, rss in memory],
    }


def _pct(sorted_values, q):
    if not sorted_values:
        return None
    return round(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))], 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=4.0, help="requests per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    args = parser.parse_args(argv)
    flags = ("--profile", "fast=scheduler(name=dpm++2m,steps=10)", "--max-batch", "16", "--max-queue", "64")
    log = Path("/tmp/fastdiff-soak-server.log")
    with Server("digits", *flags, log=log) as server:
        result = asyncio.run(soak(server.url, server.proc.pid, args.minutes, args.rate, args.seed))
    result["server_exit_status"] = server.returncode
    row = {k: v for k, v in result.items() if k not in ("statuses", "rss_mb_samples")}
    print(json.dumps(row, indent=1))
    passed = (
        result["lost"] == 0
        and result["server_errors_5xx"] == 0
        and result["invalid_not_4xx"] == 0
        and (result["rss_growth_after_1min"] or 0) <= 0.05
    )
    out = {
        "benchmark": "soak",
        "device": "2-core CPU, server on 1 torch thread, client in another process",
        "date": str(date.today()),
        "command": f"python benchmarks/soak.py --minutes {args.minutes:g} --rate {args.rate:g} --seed {args.seed}",
        "model": "digits (shipped), dpm++2m 10 steps, --max-batch 16 --max-queue 64",
        "passed": passed,
        **result,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_record(args.out, out, benchmark="soak")
    print(f"passed: {passed}; wrote {args.out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
