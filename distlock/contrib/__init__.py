"""Adapters for the libraries where Python users already need a lock; each behind an extra.

One module per library (``distlock.contrib.dogpile``, ``distlock.contrib.django``, ...), each
installed with the extra of its name (``pip install 'distlock-redis[dogpile]'``). This file
imports nothing: ``import distlock`` never imports an adapted library, and one adapter never
loads another. This package is distlock's top layer (setup.cfg's import-linter contract): it
may import every layer below it, and nothing in distlock imports it.
"""
