#!/usr/bin/env python
"""Server-side cost of an uncontended acquire+release, in instructions, not seconds.

Runs a private ``redis-server`` on 127.0.0.1 under ``valgrind --tool=callgrind`` with
instrumentation off, turns it on around ``--ops`` calls of each candidate (after a warm-up), and
reads the instruction count the server executed for them from a callgrind dump. Instruction
counts repeat run after run whatever else the machine is doing, where the timings of
``bench_locks.py`` / ``bench_sync.py`` swing by 10-20 % on a small VM; they show what a
change to a Lua script costs the server, and nothing of the client or the network.

Candidates: the floor (two ``EVALSHA`` of ``return 1``), DistLock, DistRLock, DistSemaphore
and DistBoundedSemaphore (value 1). The server runs with ``hz 1`` so that its timer work,
slowed down by valgrind, adds little to the counts.

Usage::

    python benchmarks/server_instructions.py [--ops N] [--json out.json]

Needs ``valgrind`` (with ``callgrind_control``) and ``redis-server`` on PATH. Takes about a
minute.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

import redis

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import _common as C  # noqa: E402
from benchmarks._internals import RedisServer
from distlock import DistBoundedSemaphore, DistLock, DistRLock, DistSemaphore

WARMUP = 50


class CallgrindServer:
    """A private redis-server (``RedisServer``) run by valgrind, instrumentation off until
    ``count`` asks for it. valgrind goes in through a wrapper script given as the server's
    binary, so starting, waiting for PING and stopping are RedisServer's own."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        wrapper = os.path.join(folder, "redis-server-callgrind")
        with open(wrapper, "w", encoding="utf-8") as fh:
            fh.write("#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no "
                     f"--callgrind-out-file={folder}/cg.%p {shutil.which('redis-server')} \"$@\"\n")
        os.chmod(wrapper, 0o755)
        self.server = RedisServer(binary=wrapper, extra_args=["--hz", "1"])
        assert self.server.proc is not None
        self.pid = self.server.proc.pid  # the shell exec()s valgrind: the same process
        self.client = redis.Redis.from_url(self.server.url)
        self.dumps = 0

    def _control(self, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(self.pid)], check=True,
                       capture_output=True)

    def count(self, fn: Callable[[], object], ops: int) -> float:
        """Server instructions per call of ``fn``."""
        for _ in range(WARMUP):
            fn()
        self._control("-i", "on")
        for _ in range(ops):
            fn()
        self._control("-i", "off")
        self._control("-d", "bench")
        self.dumps += 1
        path = f"{self.folder}/cg.{self.pid}.{self.dumps}"
        deadline = time.monotonic() + 60
        while True:
            text = open(path).read() if os.path.exists(path) else ""
            found = re.search(r"^totals:\s+(\d+)", text, re.M)
            if found:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"no callgrind dump at {path}")
            time.sleep(0.2)
        self._control("-z")
        return int(found.group(1)) / ops

    def stop(self) -> None:
        self.client.close()
        self.server.stop()


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=300, help="calls counted per candidate")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args(argv)
    for tool in ("valgrind", "callgrind_control", "redis-server"):
        if shutil.which(tool) is None:
            print(f"{tool} is not on PATH", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="distlock-cg-") as folder:
        server = CallgrindServer(folder)
        try:
            client = server.client
            script = client.register_script("return 1")
            lock = DistLock("bench:cg:lock", client=client)
            rlock = DistRLock("bench:cg:rlock", client=client)
            plain = DistSemaphore("bench:cg:sem", 1, client=client)
            bounded = DistBoundedSemaphore("bench:cg:bsem", 1, client=client)
            ops: Dict[str, Callable[[], object]] = {
                "floor": C.cycle(script, script),
                "DistLock": C.cycle(lock.acquire, lock.release),
                "DistRLock": C.cycle(rlock.acquire, rlock.release),
                "DistSemaphore": C.cycle(plain.acquire, plain.release),
                "DistBoundedSemaphore": C.cycle(bounded.acquire, bounded.release),
            }
            counts = {}
            for label, fn in ops.items():
                C.eprint(f"counting {label} ({args.ops} calls)")
                counts[label] = server.count(fn, args.ops)
        finally:
            server.stop()
    floor = counts["floor"]
    rows = [C.Row("server instructions, uncontended acquire+release",
                  "2 x EVALSHA 'return 1'" if label == "floor" else label, value, "instr/op",
                  value / floor, note=f"{args.ops} calls under callgrind")
            for label, value in counts.items()]
    print(C.format_table(rows))
    if args.json:
        C.write_json(args.json, {"ops": args.ops, "tool": "callgrind"}, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
