"""fastdiff tune: budgets, spaces (validation, conflict pruning), the search on the shipped digits model
(grid and successive halving, resumable cache, frontier), the report on a second seed, and the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from fastdiff import FastPipeline
from fastdiff.cli.main import main
from fastdiff.tune import (
    BudgetError,
    SpaceError,
    default_space,
    load_space,
    parse_budget,
    parse_budgets,
    tune,
)
from fastdiff.tune.search import derive_rungs, pareto

SMALL = {  # 2 samplers x 2 steps x 2 caches x 2 windows = 16 candidates (one of them is the baseline)
    "baseline": "dpm++2m 6",
    "samplers": ["dpm++2m", "unipc"],
    "steps": [3, 6],
    "axes": {"cache": ["", "deepcache(interval=3)"], "guidance": ["", "cfg-interval(start=0.0,end=0.4)"]},
    "settings": {"images": 20, "rungs": [10, 20], "grid_max": 4},
}


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    from fastdiff.zoo.shipped import install_digits

    return install_digits(tmp_path_factory.mktemp("tune") / "digits")


# -- budgets --------------------------------------------------------------------------------------------------


def test_budget_forms():
    base = {"accuracy": 0.99, "fd": 10.0}
    point = parse_budget("accuracy >= -1 point")
    assert (point.mode, point.value) == ("delta", -0.01) and point.threshold(base) == pytest.approx(0.98)
    assert parse_budget("accuracy>=-0.01").threshold(base) == pytest.approx(0.98)
    assert parse_budget("accuracy>=97%").threshold(base) == pytest.approx(0.97)
    ratio = parse_budget("fd<=1.2x")
    assert ratio.threshold(base) == pytest.approx(12.0) and str(ratio) == "fd<=1.2x"
    assert ratio.holds({"fd": 11.9}, base) and not ratio.holds({"fd": 12.1}, base)
    assert ratio.holds({"fd": 12.1}, base, slack=0.05)  # screening rungs loosen the threshold
    psnr = parse_budget("psnr>=35")
    assert psnr.holds({"spec": "b", "is_baseline": True}, base)  # the baseline is identical to itself
    assert not psnr.holds({"psnr": 30.0}, base)
    assert len(parse_budgets(["accuracy>=-1 point, fd<=1.2x"])) == 2


@pytest.mark.parametrize(
    "text, problem",
    [
        ("acc>=-1 point", "unknown metric 'acc'"),
        ("fd>=1.2x", "upper bound"),
        ("accuracy<=-1 point", "lower bound"),
        ("psnr>=1.1x", "absolute value"),
        ("fd<=0x", "must be positive"),
        ("accuracy about 1", "cannot read budget"),
        ("", "empty budget"),
    ],
)
def test_bad_budgets_name_the_problem(text, problem):
    with pytest.raises(BudgetError, match=problem):
        parse_budget(text)


# -- spaces ---------------------------------------------------------------------------------------------------


def test_default_spaces_load_and_enumerate():
    for family in ("digits", "unet", "dit", "flow", "samplers"):
        space = load_space(default_space(family))
        candidates, _ = space.candidates(cfg=True)
        assert candidates and space.baseline not in candidates
        assert yaml.safe_load(yaml.safe_dump(space.to_dict()))["samplers"] == space.samplers  # YAML-able
    digits = load_space(default_space("digits"))
    with_cfg, without_cfg = digits.candidates(cfg=True)[0], digits.candidates(cfg=False)[0]
    assert len(without_cfg) < len(with_cfg) and not any("cfg-interval" in c for c in without_cfg)


def test_conflicts_are_pruned_before_running():
    space = load_space(
        {
            "samplers": ["unipc"],
            "steps": [5],
            "axes": {"a": ["", "deepcache(interval=3)"], "b": ["", "forecast(order=1,interval=2)"]},
        }
    )
    candidates, pruned = space.candidates()
    assert not any("deepcache" in c and "forecast" in c for c in candidates)
    assert len(candidates) == 3 and sum(pruned.values()) == 1
    assert "deepcache + forecast" in next(iter(pruned))
    # two samplers in one candidate (a scheduler option on an axis) are pruned too
    space = load_space({"samplers": ["unipc"], "steps": [5], "axes": {"x": ["", "scheduler(name=ddim,steps=4)"]}})
    assert space.candidates()[0] == ["scheduler(name=unipc,steps=5)"]


@pytest.mark.parametrize(
    "space, problem",
    [
        ({"samplers": ["dpm3"], "steps": [5]}, "unknown sampler preset 'dpm3'"),
        ({"samplers": ["unipc"], "steps": [0]}, "steps: 0 is not a positive integer"),
        ({"samplers": ["unipc"]}, "no steps"),
        ({"samplers": ["unipc"], "steps": [5], "axis": {}}, "unknown key"),
        (
            {"samplers": ["unipc"], "steps": [5], "axes": {"c": ["deepcache(intervals=3)"]}},
            "axis 'c'.*intervals",
        ),
        ({"samplers": ["unipc"], "steps": [5], "axes": {"c": []}}, "axis 'c' has no options"),
        ({"samplers": ["unipc"], "steps": [5], "settings": {"eta": 1}}, "settings.eta"),
        (
            {"samplers": ["unipc"], "steps": [5], "settings": {"images": 20, "rungs": [5, 10]}},
            "must end with",
        ),
        ({"samplers": ["unipc"], "steps": [5], "settings": {"speed": 1}}, "unknown settings"),
        ({"samplers": ["unipc"], "steps": [5], "baseline": "fast 20"}, "baseline"),
        ({}, "the space is empty"),
    ],
)
def test_bad_spaces_name_the_problem(space, problem):
    with pytest.raises(SpaceError, match=problem):
        load_space(space)


def test_space_file_and_models(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "samplers": ["unipc"],
                "steps": [5],
                "combine_models": False,
                "model_steps": [2, 4],
                "models": [f"student(path={tmp_path}/not-trained-yet,steps={{steps}})"],
            }
        )
    )
    space = load_space(path, baseline="ddim 50")
    assert space.baseline == "scheduler(name=ddim,steps=50)"
    assert [s["spec"] for s in space.skipped] == [
        f"student(path={tmp_path}/not-trained-yet,steps={n})" for n in (2, 4)
    ]
    (tmp_path / "bad.yaml").write_text("samplers: [unipc\n")
    with pytest.raises(SpaceError, match="not valid YAML"):
        load_space(tmp_path / "bad.yaml")
    with pytest.raises(SpaceError, match="does not exist"):
        load_space(tmp_path / "missing.yaml")


def test_rungs_and_pareto():
    assert derive_rungs(500, 3, 10) == [50, 160, 500]
    rows = [
        {"spec": "a", "speed": 1.0, "speedup": 3.0, "accuracy": 0.9},
        {"spec": "b", "speed": 2.0, "speedup": 1.5, "accuracy": 0.95},
        {"spec": "c", "speed": 2.5, "speedup": 1.2, "accuracy": 0.94},  # slower and worse than b
        {"spec": "d", "speed": 3.0, "speedup": 1.0, "accuracy": 0.99},
    ]
    front = pareto(rows, parse_budgets(["accuracy>=-1 point"]), "speed")
    assert [r["spec"] for r in front] == ["a", "b", "d"]


# -- the search, measured on the shipped digits model ------------------------------------------------------------


def test_grid_search_finds_fastest_within_budget(digits, tmp_path):
    space = dict(SMALL, samplers=["unipc"], axes={"cache": ["", "deepcache(interval=3)"]})  # 4 candidates: grid
    result = tune(
        digits,
        ["psnr>=20", "accuracy>=-5 points"],
        space=space,
        guidance=2.0,
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    assert result["strategy"] == "grid" and result["rungs"] == [20]
    assert result["counts"]["measurements"] == 4 + 1  # candidates + baseline, each measured once
    best, base = result["best"], result["baseline"]
    assert best["within_budget"] and best["psnr"] >= 20 and best["accuracy"] >= base["accuracy"] - 0.05
    rows = [m for c in result["candidates"] for m in c["measurements"]]
    faster_in_budget = [
        r
        for r in rows
        if r["cpu_seconds_median"] < best["seconds"] and r["psnr"] >= 20 and r["accuracy"] >= base["accuracy"] - 0.05
    ]
    assert not faster_in_budget
    assert any(r["spec"] == best["spec"] for r in result["frontier"])
    assert result["seeds"] == {"selection": 0, "report": 1} and result["selection"]["best"] == best
    assert {m["seed"] for m in [*rows, base]} == {0}  # every search measurement is on the selection seed
    report = result["report"]
    assert report["seed"] == 1 and report["images"] == 20 and report["best"]["spec"] == best["spec"]
    assert [r["spec"] for r in report["frontier"]] == [r["spec"] for r in result["frontier"]]
    remeasured = {base["spec"], best["spec"], *(r["spec"] for r in result["frontier"])}
    assert report["counts"] == {"measurements": len(remeasured), "cache_hits": 0} and report["complete"]
    fp = FastPipeline.from_pretrained(digits, accelerators=best["spec"])  # the answer is a loadable spec
    assert [str(c) for c in fp.accelerators] == [s for s in best["spec"].split(";")] or best["spec"] == base["spec"]


def test_successive_halving_and_resume(digits, tmp_path):
    kwargs = dict(space=SMALL, guidance=2.0, cache_dir=tmp_path / "cache", progress=False)
    first = tune(digits, ["accuracy>=-10 points"], **kwargs)
    assert first["strategy"] == "successive-halving" and first["rungs"] == [10, 20]
    per_rung = {
        n: sum(any(m["images"] == n for m in c["measurements"]) for c in first["candidates"]) for n in (10, 20)
    }
    assert per_rung[10] == first["counts"]["candidates"] == 15 and per_rung[20] == 5  # ceil(15 / 3) survive
    assert first["best"]["within_budget"] and first["best"]["speedup"] > 1
    again = tune(digits, ["accuracy>=-10 points"], **kwargs)  # resumed from the cache: nothing measured twice
    assert again["counts"]["measurements"] == 0 and again["counts"]["cache_hits"] == 15 + 5 + 2
    assert again["best"]["spec"] == first["best"]["spec"]
    hits = sum(first["report"]["counts"].values())  # the report seed's rows come from the cache too
    assert again["report"]["counts"] == {"measurements": 0, "cache_hits": hits}
    assert again["report"]["best"] == first["report"]["best"]
    limited = tune(digits, ["fd<=3x"], space=SMALL, guidance=2.0, time_limit=1e-6, progress=False)
    assert not limited["complete"] and limited["best"]["spec"] == limited["baseline"]["spec"]
    # past the time limit the baseline (here also the pick) is still measured on the report seed
    assert limited["report"]["best"]["spec"] == limited["baseline"]["spec"]
    assert limited["report"]["counts"] == {"measurements": 1, "cache_hits": 0}


def test_cli(digits, tmp_path, capsys):
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump(dict(SMALL, samplers=["unipc"], steps=[3], axes={})))
    out = tmp_path / "best.json"
    main(
        [
            "tune",
            str(digits),
            "--budget",
            "accuracy>=-5 points",
            "--space",
            str(space),
            "--guidance",
            "2",
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "cache"),
            "--quiet",
            "--report-seed",
            "5",
        ]
    )
    result = json.loads(out.read_text())
    assert result["best"]["spec"] in ("scheduler(name=unipc,steps=3)", result["baseline"]["spec"])
    assert result["seeds"] == {"selection": 0, "report": 5}
    assert {"commit", "date", "device", "load"} <= set(result)  # provenance beside the search
    assert result["report"]["best"]["spec"] == result["best"]["spec"]
    printed = capsys.readouterr().out
    assert "best:" in printed and "selected on seed 0, reported on seed 5" in printed
    assert "accuracy>=-5 points: selection holds" in printed
    with pytest.raises(SystemExit, match="unknown metric 'acc'"):
        main(["tune", str(digits), "--budget", "acc>=1", "--out", str(out)])
    with pytest.raises(SystemExit, match="reports no 'ode_error'"):
        main(
            [
                "tune",
                str(digits),
                "--budget",
                "ode_error<=1.1x",
                "--space",
                str(space),
                "--out",
                str(out),
                "--no-cache",
                "--quiet",
            ]
        )


def test_no_setting_meets_an_absolute_budget(digits, tmp_path):
    space = dict(SMALL, samplers=["unipc"], steps=[3], axes={})
    result = tune(digits, ["accuracy>=101%"], space=space, guidance=2.0, cache_dir=tmp_path, progress=False)
    assert result["best"] is None and not result["baseline"]["within_budget"]
    with pytest.raises(SystemExit, match="no measured setting meets"):
        main(
            [
                "tune",
                str(digits),
                "--budget",
                "accuracy>=101%",
                "--space",
                str(_write(tmp_path, space)),
                "--guidance",
                "2",
                "--out",
                str(tmp_path / "none.json"),
                "--cache",
                str(tmp_path),
                "--quiet",
            ]
        )


def _write(tmp_path, space):
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def test_cache_is_per_baseline(digits, tmp_path):
    space = dict(SMALL, samplers=["unipc"], steps=[3], axes={})
    first = tune(digits, ["psnr>=10"], space=space, guidance=2.0, cache_dir=tmp_path, progress=False)
    other = tune(
        digits, ["psnr>=10"], space=space, baseline="ddim 4", guidance=2.0, cache_dir=tmp_path, progress=False
    )
    assert other["baseline"]["spec"] == "scheduler(name=ddim,steps=4)" and other["counts"]["measurements"] == 2
    psnr = [c["measurements"][0]["psnr"] for c in (first["candidates"][0], other["candidates"][0])]
    assert psnr[0] != psnr[1]  # the candidate's PSNR is against each baseline's own images


@pytest.mark.full  # about 25 s on the shared 2-core machine
def test_backfill_when_no_survivor_holds(digits, tmp_path):
    # at 40 images "-1 point" vs a 100% baseline allows no miss; the fastest survivors of the 20-image screen
    # tend to miss one image, and then the next plausible candidates are measured in full until one holds
    space = dict(SMALL, steps=[4, 6, 10], settings={"images": 40, "rungs": [20, 40], "eta": 3})
    result = tune(digits, ["accuracy>=-1 point"], space=space, guidance=2.0, cache_dir=tmp_path, progress=False)
    full = [m for c in result["candidates"] for m in c["measurements"] if m["images"] == 40]
    assert result["baseline"]["accuracy"] == 1.0
    assert any(m["accuracy"] == 1.0 for m in full) and result["best"]["spec"] != result["baseline"]["spec"]
    assert result["best"]["accuracy"] == 1.0 and result["best"]["speedup"] > 1


def test_flow_models_get_the_flow_space_and_every_candidate_applies():
    """A flow-matching transformer tunes over flow presets and block caches (the DiT space's noise presets would
    be refused on it); every candidate of that space applies to an SD3 pipeline and removes cleanly."""
    from fastdiff import FastPipeline
    from fastdiff.tune.space import family_of
    from fastdiff.zoo.tiny_flow import make_flow_pipeline

    fp = FastPipeline(make_flow_pipeline("tiny-sd3"))
    assert family_of(fp.pipe) == "flow"
    space = load_space(default_space("flow"))
    candidates, _ = space.candidates(cfg=True)
    assert len(candidates) > 100 and all("flow-" in c for c in candidates)
    for spec in [space.baseline, *candidates]:
        fp.accelerate(spec).remove()
        assert not fp.accelerators, spec


def test_guidance_kind_candidates_follow_the_call_also_for_separate_guidance_calls(tmp_path):
    """Qwen-Image runs guidance as a second denoiser call (with a negative prompt, true_cfg_scale > 1): the
    measurer sees guidance there, so cfg-interval candidates stay; at scale 1 there is none to shorten."""
    from fastdiff.tune.measure import Measurer
    from fastdiff.zoo import build

    model = build("tiny-qwen-image", tmp_path / "qwen", size="test")
    assert Measurer(model, cache_dir=tmp_path / "c", steps=2).cfg
    assert not Measurer(model, cache_dir=tmp_path / "c", guidance=1.0, steps=2).cfg


# -- the report on a second seed --------------------------------------------------------------------------------

ONE = dict(SMALL, samplers=["unipc"], steps=[3], axes={}, settings={"images": 10})  # one candidate, 10 images


def test_report_figures_come_from_the_report_seed(digits, tmp_path):
    """The search runs on seed 0, the report on seed 2; the two samples are cached apart (the measurer's cache
    returns each seed's own rows) and give other figures (other initial noise, other digits)."""
    from fastdiff.tune.measure import Measurer

    result = tune(
        digits, ["accuracy>=-20 points"], space=ONE, guidance=2.0, cache_dir=tmp_path, report_seed=2, progress=False
    )
    selection, report = result["selection"], result["report"]
    assert (selection["seed"], report["seed"], report["images"]) == (0, 2, 10)
    assert report["best"]["spec"] == selection["best"]["spec"] == result["best"]["spec"]
    assert selection["baseline"]["fd"] != report["baseline"]["fd"]
    assert selection["best"]["fd"] != report["best"]["fd"]
    m = Measurer(digits, cache_dir=tmp_path, guidance=2.0)
    spec = result["baseline"]["spec"]
    assert m.key(spec, 10, True) == m.key(spec, 10, True, seed=0) != m.key(spec, 10, True, seed=2)
    again = {seed: m.measure(spec, 10, baseline=True, seed=seed) for seed in (0, 2)}
    assert (m.runs, m.hits) == (0, 2)  # both samples were cached, each under its own seed
    assert again[0]["fd"] == selection["baseline"]["fd"] and again[2]["fd"] == report["baseline"]["fd"]
    assert again[2]["seed"] == 2 and not np.array_equal(m.references[0, 10], m.references[2, 10])


def test_a_pick_that_misses_on_the_report_seed_is_reported_not_replaced(digits, tmp_path, monkeypatch, capsys):
    """Candidates lose 50 points of accuracy on the report seed (a stand-in for a pick that was lucky on the
    selection sample): the pick stays, its verdict on the report seed says it misses, the table says so."""
    from fastdiff.tune.measure import Measurer

    measure = Measurer.measure

    def worse_on_seed_1(self, spec, images, baseline=False, seed=None):
        row = measure(self, spec, images, baseline, seed)
        return dict(row, accuracy=row["accuracy"] - 0.5) if seed == 1 and "accuracy" in row and not baseline else row

    monkeypatch.setattr(Measurer, "measure", worse_on_seed_1)
    out = tmp_path / "best.json"
    main(
        [
            "tune",
            str(digits),
            "--budget",
            "accuracy>=-20 points",
            "--space",
            str(_write(tmp_path, ONE)),
            "--guidance",
            "2",
            "--out",
            str(out),
            "--cache",
            str(tmp_path / "cache"),
            "--quiet",
        ]
    )
    result = json.loads(out.read_text())
    pick, report = result["best"], result["report"]
    assert pick["spec"] == "scheduler(name=unipc,steps=3)" and pick["within_budget"]
    assert pick["verdicts"]["accuracy>=-20 points"]["holds"]
    assert report["best"]["spec"] == pick["spec"] and report["within_budget"] is False  # not re-picked
    verdict = report["best"]["verdicts"]["accuracy>=-20 points"]
    assert not verdict["holds"] and verdict["value"] == report["best"]["accuracy"] <= 0.5
    assert verdict["threshold"] == pytest.approx(report["baseline"]["accuracy"] - 0.2)
    assert result["frontier"][0]["within_budget"] and not report["frontier"][0]["within_budget"]
    printed = capsys.readouterr().out
    assert "selection holds" in printed and "report MISSES" in printed
    assert "misses the budget on the report seed 1" in printed


def test_equal_seeds_are_refused(digits, tmp_path):
    with pytest.raises(ValueError, match="report seed equals the selection seed"):
        tune(digits, ["accuracy>=-1 point"], seed=3, report_seed=3, progress=False)
    command = ["tune", str(digits), "--budget", "accuracy>=-1 point", "--out", str(tmp_path / "x")]
    with pytest.raises(SystemExit, match="--report-seed 1 equals --seed 1"):  # the default report seed is 1
        main([*command, "--seed", "1"])
    with pytest.raises(SystemExit, match="--report-seed 4 equals --seed 4"):
        main([*command, "--seed", "4", "--report-seed", "4"])
    assert not (tmp_path / "x").exists()
