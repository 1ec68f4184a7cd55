"""The ``distlock`` command line (the console script, and ``python -m distlock``).

Its modules, from the top down; each imports only modules listed after it:

- ``main``: the argument parser and ``main()``, which dispatches to a command and turns errors
  into exit statuses (``distlock.__main__`` takes ``main`` from here);
- the commands: ``run`` (``distlock run``, flock(1) across hosts); ``state`` (``status``,
  ``list``, ``release``, ``top``, and the reads of lock state they share; ``run`` uses them to
  name a lock's holder); ``bench`` (``demo`` and ``bench``, which start servers of their own);
- what two commands run: ``top`` (the live view's I/O and terminal) and ``demo`` (the
  lost-update race in worker processes), each imported only when its command runs;
- shared I/O: ``connect`` (``connect(url)`` and the ``--url`` checks) and ``servers`` (reads on
  one server, or on every master of a cluster);
- no I/O: ``top_rows`` (top's rows, their order and text), ``inspect`` (lock state parsed from
  raw replies) and ``exits`` (exit statuses and the one-line error).

This package is distlock's top layer (setup.cfg's import-linter contract): it may import every
layer below it (``distlock.testing``, ``distlock.asyncio``, ``_primitives``, ``_session``,
``_redis``, ``_core``), and nothing in distlock imports it but ``distlock.__main__``. This file
imports nothing, so that ``distlock._cli.main`` stays the module and loading one module does not
load the others.
"""
