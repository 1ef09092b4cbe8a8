"""Property-based tests of the ``fastdiff`` command line: bad arguments exit 2 with one error line.

The form, for every command: status 2; stderr holds exactly one error line ``fastdiff[ CMD...]: error: ...``,
last, preceded only by argparse's usage block (``usage: ...`` and its indented continuation lines) when the
error was found while parsing; no traceback. The bad cases are built so that they fail while parsing or
while checking the model path, before anything loads, trains or serves.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, note, settings
from hypothesis import strategies as st

from fastdiff.cli.args import FloatRange, IntRange, accel_specs, existing_file, named_specs
from fastdiff.cli.main import build_parser, commands, main
from fastdiff.core.registry import AcceleratorError, available
from fastdiff.core.spec import parse
from fastdiff.zoo import available as zoo_models

available()  # load every family now: import-time warnings stay out of the examples
COMMANDS = commands(build_parser())
ZOO = set(zoo_models())
MISSING = "/nonexistent-fastdiff-fuzz"
MODEL_DESTS = ("model", "teacher")
VALID = {"budget": "psnr>=35", "sampler": "dpm++2m"}  # required options with a grammar of their own
ERROR_LINE = re.compile(r"^fastdiff(?: [a-z][\w-]*)*: error: \S")
NUMERIC = (int, float, IntRange, FloatRange)


def options(parser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def takes(action, *types) -> bool:
    return action.type in types or isinstance(action.type, tuple(t for t in types if isinstance(t, type)))


def required_argv(words, model=MISSING) -> list[str]:
    """``words`` plus every required positional and option, with harmless values; MODEL is ``model``."""
    argv = list(words)
    for a in COMMANDS[words]._actions:
        if not a.option_strings:
            argv.append(model if a.dest in MODEL_DESTS else f"{MISSING}/{a.dest}")
        elif a.required:
            value = VALID.get(a.dest) or (a.choices and list(a.choices)[0])
            if value is None:
                value = "base=" if a.type is named_specs else "" if a.type is accel_specs else f"{MISSING}/out"
                value = str(a.type.low) if isinstance(a.type, IntRange) else value
            argv += [a.option_strings[0], str(value)]
    return argv


def run_main(argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            return exc.code, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def check_usage_error(code, out, err, expect=None) -> str:
    """The form in the module docstring; returns the error line."""
    assert "Traceback" not in err
    assert code == 2, err
    assert out == ""  # nothing ran
    lines = err.splitlines()
    errors = [line for line in lines if ERROR_LINE.match(line)]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    if len(lines) > 1:
        assert lines[0].startswith("usage: fastdiff") and all(line[:1].isspace() for line in lines[1:-1]), err
    if expect is not None:
        assert expect in errors[0], err
    return errors[0]


PLAIN = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
LONG = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=200, max_size=400)
NOT_A_NUMBER = st.one_of(PLAIN, st.sampled_from(["nan", "inf", "-inf", "1e999", "1.5", "0x10", "", " ", "3 4"]))


def _fails(convert, text) -> bool:
    try:
        convert(text)
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return True
    return False


def out_of_range(kind) -> st.SearchStrategy:
    if isinstance(kind, IntRange):
        below = st.integers(max_value=kind.low - 1)
        return (below if kind.high is None else st.one_of(below, st.integers(min_value=kind.high + 1))).map(str)
    edges = [st.sampled_from(["nan", "inf", "-inf"])]
    if kind.low is not None:
        edges.append(st.floats(max_value=kind.low, exclude_max=not kind.open_low, allow_nan=False))
    if kind.high is not None:
        edges.append(st.floats(min_value=kind.high, exclude_min=True, allow_nan=False))
    return st.one_of(edges).map(str)


def _bad_spec(text) -> bool:
    try:
        parse(text)
    except AcceleratorError:
        return True
    return False


SPEC_TOKENS = st.sampled_from(["deepcache", "scheduler", "tome", "(", ")", "=", ",", ";", '"', "name", "x", "1"])
BAD_SPECS = st.one_of(PLAIN, st.lists(SPEC_TOKENS, min_size=1, max_size=8).map("".join)).filter(_bad_spec)


@st.composite
def bad_case(draw, words) -> tuple[list[str], str | None]:
    """``(argv, text the error line must contain)`` for one kind of bad input to command ``words``."""
    parser, base = COMMANDS[words], required_argv(words)
    flags = options(parser)
    kinds = ["unknown flag"]
    kinds += ["missing required"] * any(a.required or not a.option_strings for a in parser._actions)
    kinds += ["not a number"] * any(takes(a, *NUMERIC) for a in flags)
    kinds += ["out of range"] * any(isinstance(a.type, (IntRange, FloatRange)) for a in flags)
    kinds += ["bad spec"] * any(takes(a, accel_specs, named_specs) for a in flags)
    kinds += ["missing file"] * any(takes(a, existing_file) for a in flags)
    kinds += ["missing model"] * any(a.dest in MODEL_DESTS for a in parser._actions if not a.option_strings)
    kind = draw(st.sampled_from(kinds))
    note(kind)

    def flag(*types, where=lambda a: True):
        action = draw(st.sampled_from([a for a in flags if takes(a, *types) and where(a)]))
        return action, action.option_strings[0]

    def with_value(name, value):  # "--x=-1" is one token: argparse cannot mistake -1 for a flag
        return base + (
            draw(st.sampled_from([[f"{name}={value}"], [name, value]])) if value[:1] != "-" else [f"{name}={value}"]
        )

    if kind == "unknown flag":
        name = "--no-such-" + draw(st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True))
        return base + [name] + draw(st.lists(PLAIN.filter(lambda t: not t.startswith("-")), max_size=1)), name
    if kind == "missing required":
        return list(words), "required"
    if kind == "not a number":
        action, name = flag(*NUMERIC)
        value = draw(NOT_A_NUMBER.filter(lambda t: _fails(action.type, t)))
        return with_value(name, value), name
    if kind == "out of range":
        action, name = flag(IntRange, FloatRange, where=lambda a: isinstance(a.type, (IntRange, FloatRange)))
        return with_value(name, draw(out_of_range(action.type))), name
    if kind == "bad spec":
        action, name = flag(accel_specs, named_specs)
        value = draw(BAD_SPECS)
        if action.type is named_specs:
            value = draw(st.sampled_from([f"a={value}", value.replace("=", "")]))
        return with_value(name, value), name
    if kind == "missing file":
        _, name = flag(existing_file)
        return with_value(name, f"{MISSING}/{draw(PLAIN)}.yaml"), name
    model = draw(st.one_of(PLAIN.map(lambda t: f"{MISSING}/{t}"), PLAIN.filter(bool), LONG))
    assume(model not in ZOO and not model.startswith("-") and not os.path.lexists(os.path.expanduser(model)))
    return required_argv(words, model), "neither a directory nor a zoo model"


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_bad_arguments_exit_2_with_one_line(words, data):
    argv, expect = data.draw(bad_case(words))
    check_usage_error(*run_main(argv), expect)


def test_every_command_is_covered():
    assert {w[0] for w in COMMANDS} >= {
        "zoo",
        "bench",
        "generate",
        "demo",
        "distill",
        "serve",
        "tune",
        "tpu-infer",
    }
    assert len(COMMANDS) >= 15


# Regression tests: the shrunk examples the property found.


@pytest.mark.parametrize(
    "argv, expect",
    [
        (["bench", "/nope", "--config", "a="], "nope"),  # was "error: ..." with status 1
        (["bench", "/nope", "--config", "a=x", "--runs", "0"], "--config"),  # checked after loading the model
        (["demo", "--runs=0"], "--runs"),  # started the demo
        (["generate", "/nope", "--out", "o", "--guidance", "nan"], "--guidance"),
        (["tune", "/nope", "--budget", "psnr>=35", "--space", "/nope.yaml"], "--space"),
        (["serve", "/nope", "--token-file", "/nope"], "no such file"),
        (["serve", "/nope", "--max-batch", "0"], "--max-batch"),  # refused late, by the batcher
        (["serve", "/nope", "--profile", "fast=nosuch(x=1)"], "--profile"),  # after loading the model
        (["bench", "~nosuchuser-fastdiff/m", "--config", "a="], "neither a directory"),  # RuntimeError
        (["bench", "a" * 300, "--config", "a="], "neither a directory"),  # OSError: file name too long
    ],
)
def test_found_cases(argv, expect):
    line = check_usage_error(*run_main(argv), expect)
    assert line.startswith(f"fastdiff {argv[0]}: error: ")


def test_bugs_keep_their_traceback(monkeypatch):
    """Only user errors become status 2: anything else is a bug and is raised as it is."""
    import fastdiff.cli.main as cli

    def broken(args):
        raise IndexError("a bug")

    monkeypatch.setattr(cli, "cmd_zoo", broken)
    with pytest.raises(IndexError, match="a bug"):
        main(["zoo", "list"])


def test_library_messages_survive():
    """``str(SystemExit)`` is the error line, as tests that match on it (test_distill, test_tune) expect."""
    with pytest.raises(SystemExit, match="--runs: must be an integer >= 1, got 0") as info:
        with contextlib.redirect_stderr(io.StringIO()):
            main(["demo", "--runs", "0"])
    assert info.value.code == 2


ROOT = Path(__file__).resolve().parents[2]


def test_no_traceback_reaches_the_terminal():
    """``python -m fastdiff.cli.main`` on a runtime user error: status 2 and the line, printed once.

    One case only: each interpreter start imports torch and diffusers (about 30 s on a loaded 2-core machine);
    errors argparse finds go through the same ``error_exit``, checked in-process above.
    """
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    argv = ["bench", f"{MISSING}/model", "--config", "base="]
    proc = subprocess.run(
        [sys.executable, "-m", "fastdiff.cli.main", *argv], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()  # third-party import warnings may come first
    assert sum(bool(ERROR_LINE.match(line)) for line in lines) == 1, proc.stderr
    assert lines[-1].startswith("fastdiff bench: error: ") and MISSING in lines[-1] and proc.stdout == ""
