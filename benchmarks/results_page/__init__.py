"""Generate docs/results.md and the measured blocks of README.md and docs/*.md from benchmarks/results/*.json.

    python -m benchmarks.results_page            # write docs/results.md and refresh every generated block
    python -m benchmarks.results_page --check    # exit 1, naming each page, when a page differs from the JSON

docs/results.md has one section per results file: what it measures, the command, device and date when the file
records them, and a compact table of its headline figures. Other pages hold generated blocks between markers::

    <!-- results:begin NAME -->
    ... generated, do not edit ...
    <!-- results:end -->

NAME is ``accelerators`` (the README's accelerator table) or the stem of a results file (that file's tables,
as on the results page). Nothing in a generated part comes from anywhere but a results file: a figure whose
file is missing is left out (the accelerator table then says "not measured").

The package: ``format`` (numbers and tables), ``section`` and ``sections`` (what each results file is),
``renderers_*`` (one ``r_*`` per results-file layout, by topic, with their files' sections), ``headlines``
(the README's accelerator table), ``pages`` (provenance, blocks, the check) and ``__main__`` (the command line).
"""
