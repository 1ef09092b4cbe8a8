"""The command line: write the generated pages, or ``--check`` them against the JSON."""

from __future__ import annotations

import argparse
import sys

from . import __doc__ as package_doc
from . import pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.results_page", description=package_doc.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="exit 1 when a page differs from what the JSON says")
    args = parser.parse_args(argv)
    expected = pages.expected()
    return pages.check(expected) if args.check else pages.write(expected)


if __name__ == "__main__":
    sys.exit(main())
