"""Optional packages (the compress, serve and ray extras): a missing one is named with the extra that installs it,
before anything changes."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from helpers import call, make_fp

from fastdiff.core.optional import EXTRAS, MissingDependency, check_needs, require
from fastdiff.core.registry import AcceleratorError, available, get


def test_a_missing_package_is_refused_before_the_pipeline_changes(monkeypatch):
    fp = make_fp("tiny-sd")
    before = call(fp, steps=2)
    monkeypatch.setitem(sys.modules, "torch_pruning", None)  # import torch_pruning now raises ImportError
    with pytest.raises(
        MissingDependency,
        match=r"prune\(.*\) needs the optional package 'torch_pruning'.*"
        r"pip install 'fastdiff-accel\[compress\]'",
    ) as info:
        fp.accelerate("prune(ratio=0.5)")
    assert isinstance(info.value, ImportError) and isinstance(info.value, AcceleratorError)
    assert fp.accelerators == ()
    np.testing.assert_array_equal(call(fp, steps=2), before)


def test_require_names_who_needs_what_and_every_declared_need_has_an_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)
    with pytest.raises(MissingDependency, match=r"fastdiff serve needs .*'fastapi'.*fastdiff-accel\[serve\]"):
        require("fastapi", "fastdiff serve")
    assert require("torch", "x") is sys.modules["torch"]
    needs = {module for name in available() for module in get(name).needs}
    assert needs == {"torch_pruning", "torchao"} and needs <= set(EXTRAS)
    check_needs([get("prune")(), get("quantize")()])  # installed here (make installs the extras)


def test_the_cli_says_which_extra_serve_needs(monkeypatch, capsys):
    from fastdiff.cli.main import main

    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(SystemExit, match=r"fastdiff serve: error: .*'uvicorn'.*fastdiff-accel\[serve\]"):
        main(["serve", "digits", "--port", "0"])
