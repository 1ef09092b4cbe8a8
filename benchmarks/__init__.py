"""Benchmark scripts (run each as ``python benchmarks/NAME.py``) and the results-page generator
(``python -m benchmarks.results_page``)."""
