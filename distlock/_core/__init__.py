"""The core: every rule of distlock that needs no I/O, shared by every primitive, both shells and
every topology.

What belongs here: anything that decides without talking to Redis, starting a thread or
reading a clock other than ``time.monotonic``. Flows and the protocol of their drivers
(``flow``: the ops a flow yields, ``Port``/``APort``), the wait policy as a state machine
(``wait_policy``), key and channel names (``keys``), deadlines and backoff (``deadlines``),
argument checks (``checks``), the scripts' reply codes and messages (``replies``) and their
decoding into outcomes (``outcomes``), the exceptions (``errors``), the settings
(``settings``), and the arithmetic of a Redlock quorum (``quorum``), of replica
acknowledgements (``replicas``) and of even shares (``shares``).

What does not: anything that sends a command (``distlock._redis``), owns a thread or a
connection (``distlock._session``), or is one primitive's own rule (``distlock._primitives``).
Nothing here imports from those packages: this is the bottom layer (setup.cfg's import-linter
contract). See docs/design.rst, principle 9.
"""
