"""Benchmarks (``nox -s bench``); not part of any distribution."""
