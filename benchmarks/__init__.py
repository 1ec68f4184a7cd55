"""Benchmarks of distlock against its peers; run ``python benchmarks/bench_locks.py --help``.

The package only exists so that worker processes (multiprocessing, spawn) can import the shared
machinery in ``benchmarks._common`` by name.
"""
