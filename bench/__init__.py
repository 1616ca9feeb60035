"""Benchmarks: each module is a script (``python bench/NAME.py``) that prints its figures; a package only so
that one benchmark can reuse another's set builder (``from bench.fr import build_set``) and mypy names each file once."""
