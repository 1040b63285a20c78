"""Benchmarks: `python -m p2plearn.bench NAME [--json]`. Each prints a table of ratios against a
baseline measured in the same run; targets live here, never in timed unit tests."""
