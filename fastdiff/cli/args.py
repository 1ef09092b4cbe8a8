"""Argument checking shared by the ``fastdiff`` commands: every user error exits 2 with one line.

The form is argparse's: ``fastdiff CMD: error: MESSAGE`` on stderr (after the usage for errors found while
parsing), status 2. Flag types here check values while parsing, before any model is loaded::

    p.add_argument("--runs", type=POSITIVE)          # 0, -1, "x" -> "argument --runs: ..."
    p.add_argument("--accel", type=accel_specs)      # specs that fastdiff.parse refuses, refused here
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path


def error_exit(prog: str, message: str) -> SystemExit:
    """Print ``PROG: error: MESSAGE`` as one line on stderr; return the SystemExit (status 2) to raise.

    Its ``str()`` is that line, so ``pytest.raises(SystemExit, match=...)`` sees the message.
    """
    text = "; ".join(line.strip() for line in str(message).splitlines() if line.strip())
    if text.startswith("error: "):
        text = text[len("error: ") :]
    line = f"{prog}: error: {text}"
    print(line, file=sys.stderr)
    exc = SystemExit(line)
    exc.code = 2
    return exc


class Parser(argparse.ArgumentParser):
    """argparse with :func:`error_exit`; subcommand parsers made by ``add_subparsers`` are of this class too."""

    def error(self, message):
        self.print_usage(sys.stderr)
        raise error_exit(self.prog, message)


class IntRange:
    """An int flag type: ``low <= value <= high``."""

    def __init__(self, low: int, high: int | None = None):
        self.low, self.high = low, high
        self.__name__ = "integer"

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < self.low or (self.high is not None and value > self.high):
            upper = f" and <= {self.high}" if self.high is not None else ""
            raise argparse.ArgumentTypeError(f"must be an integer >= {self.low}{upper}, got {value}")
        return value


class FloatRange:
    """A float flag type: finite, ``> low`` (``open_low``) or ``>= low``, and ``<= high``."""

    def __init__(self, low: float | None = None, high: float | None = None, open_low: bool = False):
        self.low, self.high, self.open_low = low, high, open_low
        self.__name__ = "number"

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        low_ok = self.low is None or (value > self.low if self.open_low else value >= self.low)
        if not math.isfinite(value) or not low_ok or (self.high is not None and value > self.high):
            bounds = [f"{'>' if self.open_low else '>='} {self.low:g}"] if self.low is not None else []
            bounds += [f"<= {self.high:g}"] if self.high is not None else []
            raise argparse.ArgumentTypeError(
                f"must be a finite number{' ' + ' and '.join(bounds) if bounds else ''}, got {text!r}"
            )
        return value


POSITIVE = IntRange(1)
NON_NEGATIVE = IntRange(0)
FINITE = FloatRange()
POSITIVE_FLOAT = FloatRange(0, open_low=True)
NON_NEGATIVE_FLOAT = FloatRange(0)
FRACTION = FloatRange(0, 1)


def accel_specs(text: str) -> str:
    """A flag type: accelerator specs, ``;``-separated, that ``fastdiff.parse`` accepts (kept as text)."""
    from fastdiff.core.registry import AcceleratorError
    from fastdiff.core.spec import parse

    try:
        parse(text)
    except AcceleratorError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def named_specs(text: str) -> str:
    """A flag type: ``NAME=SPECS`` with a name and valid specs (kept as text)."""
    name, sep, specs = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=SPECS, got {text!r}")
    accel_specs(specs)
    return text


def existing_file(text: str) -> str:
    """A flag type: a file that exists (kept as text)."""
    if not Path(text).expanduser().is_file():
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


# What main() turns into `error_exit` besides ValueError raised by fastdiff code (see main.user_error).
PATH_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError, PermissionError)
