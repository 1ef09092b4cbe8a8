"""Generate docs/results.md and the measured blocks of README.md and docs/*.md from benchmarks/results/*.json.

    python -m benchmarks.results_page            # write docs/results.md and refresh every generated block
    python -m benchmarks.results_page --check    # exit 1, naming each page, when a page differs from the JSON

docs/results.md has one section per results file: what it measures, the command, device, date, commit and load
the file records, and its figures, rendered generically (``generic``: a field's name, never the file, says how it
is shown). Other pages hold generated blocks between markers::

    <!-- results:begin NAME -->
    ... generated, do not edit ...
    <!-- results:end -->

NAME is ``accelerators`` (the README's accelerator table), ``real-sizes`` (the README's full-size table) or the
stem of a results file (that file's tables, as on the results page). Nothing in a generated part comes from anywhere but a results file: a figure whose
file is missing is left out (the accelerator table then says "not measured").

The package: ``format`` (numbers and tables), ``generic`` (any results file as settings and tables),
``sections`` with ``sections.json`` (each file's group, title, script and description: data, no code),
``headlines`` and ``real_sizes`` (the README's two tables), ``pages`` (provenance, blocks, the check) and
``__main__`` (the command line).
"""
