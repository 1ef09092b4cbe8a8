"""Load test of ``fastdiff serve`` against real servers on loopback (uvicorn subprocesses, and Ray Serve).

Run (under the shared lock on the 2-core machine; about 10 minutes)::

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/serve_load.py --out benchmarks/results/serve_load.json
    .venv/bin/python benchmarks/serve_load.py --only batching --requests-scale 0.5   # one part, fewer requests

Every server is ``python -m fastdiff.cli.main serve MODEL --threads 1`` (one torch thread; the client gets the
other core) started fresh per part, warmed up with a few requests, and stopped with SIGTERM. Clients are
``httpx.AsyncClient`` coroutines, at most ``concurrency`` requests in flight, for a fixed number of requests;
each request records exactly one outcome (a status, or the transport error). Parts:

- ``levels``: digits reference (``dpm++2m`` 10 steps) and tiny-sd test size (``dpm++2m`` 10 steps),
  ``--max-batch 16 --max-queue 64``, concurrency 1, 4, 16, 64: images/s, p50/p99 latency, statuses.
- ``lost``: digits at concurrency 64 with ``--max-queue 16``: every request gets one response and
  200s + 429s = requests sent.
- ``batching``: digits at concurrency 16, ``--max-batch 16`` vs ``--max-batch 1`` (target >= 3x images/s).
- ``switching``: one server with profiles ``a`` (dpm++2m 10) and ``b`` (unipc 10, same denoiser calls); rounds
  of [all ``a``, alternating ``a``/``b`` request by request], paired, the cost is 1 - median(alternating /
  one profile): at max-batch 1 (every batch switches) and at max-batch 16 with concurrency 32.
- ``ray``: the same digits app on Ray Serve with 2 replicas, concurrency 16 and 64 (``--max-queue 16`` each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from fastdiff.eval.record import write_record

ROOT = Path(__file__).resolve().parents[1]
FAST = "scheduler(name=dpm++2m,steps=10)"
UNI = "scheduler(name=unipc,steps=10)"
PROMPTS = ("a red fox", "a blue car", "a green tree", "a yellow house", "a cat on a mat", "a boat at sea")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``fastdiff serve`` in a subprocess on a free loopback port; SIGTERM on exit."""

    def __init__(self, model: str, *flags: str, size: str = "bench", log: Path, startup_s: float = 300):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
        cmd = [sys.executable, "-m", "fastdiff.cli.main", "serve", model, "--size", size, "--threads", "1"]
        cmd += ["--port", str(self.port), "--log-level", "warning", *flags]
        log.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(log, "w")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.startup_s = startup_s

    def __enter__(self) -> Server:
        deadline = time.monotonic() + self.startup_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"server not up after {self.startup_s} s; see {self.log.name}")

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.returncode = self.proc.wait()
        self.log.close()


def bodies(kind: str, n: int, profiles=("a",), offset: int = 0) -> list[dict]:
    out = []
    for i in range(n):
        body = {"label": i % 10} if kind == "label" else {"prompt": PROMPTS[i % len(PROMPTS)]}
        out.append({**body, "seed": offset + i, "profile": profiles[i % len(profiles)]})
    return out


async def _load(url: str, requests: list[dict], concurrency: int) -> dict:
    gate = asyncio.Semaphore(concurrency)
    outcomes: list[tuple[str, float, int]] = []
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)

    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def one(body):
            async with gate:
                started = time.perf_counter()
                try:
                    r = await client.post(f"{url}/v1/generate", json=body)
                    status, images = (
                        str(r.status_code),
                        len(r.json().get("seeds", ())) if r.status_code == 200 else 0,
                    )
                except httpx.HTTPError as error:
                    status, images = type(error).__name__, 0
                outcomes.append((status, time.perf_counter() - started, images))

        started = time.perf_counter()
        await asyncio.gather(*(one(b) for b in requests))
        wall = time.perf_counter() - started
    statuses: dict[str, int] = {}
    for status, _, _ in outcomes:
        statuses[status] = statuses.get(status, 0) + 1
    ok = sorted(t for s, t, _ in outcomes if s == "200")
    images = sum(n for _, _, n in outcomes)

    def pct(q):
        return round(ok[min(len(ok) - 1, int(q * len(ok)))], 4) if ok else None

    return dict(
        concurrency=concurrency,
        requests=len(requests),
        responses=len(outcomes),
        statuses=statuses,
        images=images,
        wall_s=round(wall, 3),
        images_per_s=round(images / wall, 3),
        p50_s=pct(0.5),
        p99_s=pct(0.99),
    )


def load(url, requests, concurrency) -> dict:
    row = asyncio.run(_load(url, requests, concurrency))
    print(
        f"  c={concurrency:3d} n={row['requests']:4d} {row['images_per_s']:8.2f} img/s  p50 {row['p50_s']}  "
        f"p99 {row['p99_s']}  {row['statuses']}",
        flush=True,
    )
    return row


def warm(url, kind, profiles=("a",)) -> None:
    load(url, bodies(kind, 4 * len(profiles), profiles, offset=10**6), 4)


def scaled(n: int, scale: float) -> int:
    return max(8, int(n * scale))


def part_levels(out: Path, s: float) -> dict:
    result = {}
    for model, kind, size in (("digits", "label", "bench"), ("tiny-sd", "prompt", "test")):
        print(f"levels: {model} ({size}), --max-batch 16 --max-queue 64", flush=True)
        flags = ["--profile", f"a={FAST}", "--max-batch", "16", "--max-queue", "64"]
        with Server(model, *flags, size=size, log=out / f"levels_{model}.log") as server:
            warm(server.url, kind)
            result[model] = [
                load(server.url, bodies(kind, scaled(n, s)), c) for c, n in ((1, 48), (4, 96), (16, 256), (64, 256))
            ]
    return result


def part_lost(out: Path, s: float) -> dict:
    print("lost: digits, concurrency 64, --max-batch 16 --max-queue 16", flush=True)
    flags = ["--profile", f"a={FAST}", "--max-batch", "16", "--max-queue", "16"]
    with Server("digits", *flags, log=out / "lost.log") as server:
        warm(server.url, "label")
        row = load(server.url, bodies("label", scaled(512, s)), 64)
    st = row["statuses"]
    row["nothing_lost"] = (
        row["responses"] == row["requests"] and st.get("200", 0) + st.get("429", 0) == row["requests"]
    )
    row["server_exit_code"] = server.returncode
    return row


def part_batching(out: Path, s: float) -> dict:
    rows = {}
    for max_batch in (16, 1):
        print(f"batching: digits, concurrency 16, --max-batch {max_batch}", flush=True)
        flags = ["--profile", f"a={FAST}", "--max-batch", str(max_batch), "--max-queue", "64"]
        with Server("digits", *flags, log=out / f"batching_{max_batch}.log") as server:
            warm(server.url, "label")
            rows[f"max_batch_{max_batch}"] = load(
                server.url, bodies("label", scaled(256 if max_batch > 1 else 96, s)), 16
            )
    gain = rows["max_batch_16"]["images_per_s"] / rows["max_batch_1"]["images_per_s"]
    return dict(rows, gain=round(gain, 3), target=3.0, met=gain >= 3.0)


def part_switching(out: Path, s: float, rounds: int) -> dict:
    result = {}
    for max_batch, concurrency, n in ((1, 4, 48), (16, 32, 256)):
        print(
            f"switching: digits, --max-batch {max_batch}, concurrency {concurrency}, {rounds} paired rounds",
            flush=True,
        )
        flags = [
            "--profile",
            f"a={FAST}",
            "--profile",
            f"b={UNI}",
            "--max-batch",
            str(max_batch),
            "--max-queue",
            "64",
        ]
        with Server("digits", *flags, log=out / f"switching_{max_batch}.log") as server:
            warm(server.url, "label", ("a", "b"))
            pairs = []
            for _ in range(rounds):
                one = load(server.url, bodies("label", scaled(n, s), ("a",)), concurrency)
                alt = load(server.url, bodies("label", scaled(n, s), ("a", "b")), concurrency)
                pairs.append({"one_profile": one, "alternating": alt})
            switches = [line for line in httpx.get(f"{server.url}/metrics").text.splitlines() if "switch" in line]
        ratios = [p["alternating"]["images_per_s"] / p["one_profile"]["images_per_s"] for p in pairs]
        cost = 1 - statistics.median(ratios)
        result[f"max_batch_{max_batch}"] = dict(
            concurrency=concurrency,
            rounds=pairs,
            ratios=[round(r, 4) for r in ratios],
            cost=round(cost, 4),
            target=0.05,
            met=cost <= 0.05,
            switch_metrics=[m for m in switches if not m.startswith("#")],
        )
    return result


def part_ray(out: Path, s: float) -> dict:
    print("ray: digits on Ray Serve, 2 replicas, --max-batch 16 --max-queue 16 each", flush=True)
    flags = ["--profile", f"a={FAST}", "--max-batch", "16", "--max-queue", "16", "--ray", "--replicas", "2"]
    flags += ["--ray-dir", str((out / "ray").absolute())]
    rows = []
    with Server("digits", *flags, log=out / "ray.log", startup_s=400) as server:
        warm(server.url, "label")
        for concurrency, n in ((16, 256), (64, 512)):
            row = load(server.url, bodies("label", scaled(n, s)), concurrency)
            st = row["statuses"]
            row["nothing_lost"] = (
                row["responses"] == row["requests"] and st.get("200", 0) + st.get("429", 0) == row["requests"]
            )
            rows.append(row)
    return dict(replicas=2, levels=rows, server_exit_code=server.returncode)


PARTS = ("levels", "lost", "batching", "switching", "ray")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/serve_load.json")
    parser.add_argument("--logs", default="out/serve_load", help="server logs and Ray's temp files")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--requests-scale", type=float, default=1.0, help="scale every request count")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds of the switching part")
    args = parser.parse_args()
    os.environ.setdefault("FASTDIFF_CACHE", str(ROOT / ".fastdiff-cache"))  # not the home directory
    logs, s = Path(args.logs), args.requests_scale
    path = Path(args.out)
    result = json.loads(path.read_text()) if path.is_file() else {}
    started = time.time()
    for part in args.only:
        t0 = time.perf_counter()
        if part == "switching":
            result[part] = part_switching(logs, s, args.rounds)
        else:
            result[part] = globals()[f"part_{part}"](logs, s)
        result[part]["seconds"] = round(time.perf_counter() - t0, 1)
        result[part]["load_average"] = os.getloadavg()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_record(path, result, benchmark="serve_load")  # after every part
    result["machine"] = dict(cpus=os.cpu_count(), started=time.strftime("%Y-%m-%d %H:%M", time.gmtime(started)))
    write_record(path, result, benchmark="serve_load")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
