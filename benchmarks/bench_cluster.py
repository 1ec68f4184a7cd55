#!/usr/bin/env python
"""distlock on a Redis Cluster (3 masters + 3 replicas) against one standalone server.

On 2 cores a cluster cannot show more throughput than one server, so this measures what holds
on any machine, each figure against the single server (or a floor) of the same run:

- commands: Redis commands (``INFO commandstats`` deltas, summed over the masters; the INFO
  calls and the replicas' REPLCONF ACKs left out) and client round trips (socket sends,
  counted in this process by wrapping redis-py's ``send_packed_command``) per uncontended
  acquire + release of DistLock and DistRLock, on the cluster and on the single server
  (target: the same);
- spread: the masters that serve 10,000 names ``DistLock(f"bench:{i}")`` (their key's slot,
  from redis-py's ``key_slot``, checked against CLUSTER KEYSLOT, and the slot map): the count
  per master and the largest deviation from an even share (target: within 10 %);
- handoff: from the start of the holder's ``release()`` here to the return of a blocked
  waiter's ``acquire()`` in another process, median, on the cluster and on the single server,
  each as a ratio to the single server's hop floor of the same run (a PUBLISH here, delivery
  to a subscribed waiter process, one EVALSHA there: ``_common.make_hint_holder`` /
  ``make_hint_waiter``); beside them, as a diagnostic, the same floor on the cluster (SPUBLISH
  to the channel's master, an SSUBSCRIBEd waiter, one EVALSHA on that node); the four
  alternate in rounds, each round a fresh waiter process;
- watchdog: one process holds 1,000 DistLocks (on all 3 masters) and calls the watchdog's
  ``renew_all()`` directly: round trips per round (socket sends of this thread, per node;
  target 3, one pipeline per master) and commands per round (target: one EVALSHA per hold,
  no SCRIPT EXISTS); the first round (new renewal connections, the renew script not yet on
  the nodes) is reported apart from the steady rounds, and the single server's round beside
  them. Then every hold is released and the servers are scanned: no key may remain but the
  fencing counters (``...:fence``, kept on purpose: see docs/safety.rst).

Usage::

    python benchmarks/bench_cluster.py [--quick] [--json out.json] [figure ...]

Figures: commands, spread, handoff, watchdog (default: all). The table goes to stdout,
progress to stderr. ``--quick`` is a short smoke run (< 60 s, most of it starting the
cluster) whose hand-off numbers mean little; the counts are exact in any run.

The servers are the benchmark's own: one ``redis-server`` and a 6-node cluster
(``benchmarks/_cluster.py``), all on free 127.0.0.1 ports, all stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` and ``distlock`` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import redis  # noqa: E402
from redis.connection import AbstractConnection  # noqa: E402
from redis.crc import key_slot  # noqa: E402

import distlock  # noqa: E402
from benchmarks import _common as C  # noqa: E402
from benchmarks._cluster import LocalCluster  # noqa: E402
from benchmarks._internals import reset_sessions
from benchmarks.bench_locks import make_distlock  # noqa: E402
from distlock import DistLock, DistRLock

FIGURES = ("commands", "spread", "handoff", "watchdog")

#: Commands in INFO commandstats that are not the client's: the snapshots themselves, and the
#: replicas' once-a-second REPLCONF ACK to their masters.
NOT_OURS = ("info", "replconf")


# --- knobs --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Knobs:
    pairs: int = 500  # acquire+release pairs counted per lock class and topology
    warmup: int = 20
    names: int = 10_000
    keyslot_checks: int = 200  # names whose slot is also asked of the server (CLUSTER KEYSLOT)
    handoff_rounds: int = 6
    handoff_samples: int = 25  # per candidate per round
    handoff_round_max_s: float = 15.0
    holds: int = 1_000
    renew_rounds: int = 6  # the first (cold) one included


FULL = Knobs()
QUICK = Knobs(pairs=20, warmup=5, keyslot_checks=20, handoff_rounds=2, handoff_samples=5,
              handoff_round_max_s=2.0, holds=300, renew_rounds=3)


# --- the result table -----------------------------------------------------------------------------

@dataclass
class Result:
    figure: str
    measured: str
    target: str
    met: Optional[bool]
    notes: str = ""
    value: Optional[float] = None
    unit: str = ""
    data: Dict[str, Any] = field(default_factory=dict)


def _met(flag: Optional[bool]) -> str:
    return "-" if flag is None else ("met" if flag else "MISSED")


def format_results(results: Sequence[Result]) -> str:
    header = ("figure", "measured", "target", "met?", "notes")
    body = [(r.figure, r.measured, r.target, _met(r.met), r.notes) for r in results]
    return C.text_table(header, body, right=set())


def _n(value: float) -> str:
    return f"{value:,.2f}" if not float(value).is_integer() else f"{value:,.0f}"


# --- counting round trips: every socket send of this process ---------------------------------------

class SendCounter:
    """Counts ``send_packed_command`` calls (one per round trip: a command, a pipeline, or
    ASKING with its command) while ``window()`` is open: per send, the sending thread, the
    port of the server it went to, and the names of the commands in it (read back from the
    RESP it carries)."""

    def __init__(self) -> None:
        self.sends: List[Send] = []
        self.on = False
        self._original: Any = None

    def install(self) -> None:
        if self._original is not None:
            return
        original = self._original = AbstractConnection.send_packed_command
        counter = self

        def counted(conn: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
            if counter.on:
                counter.sends.append(Send(threading.get_ident(),
                                          int(getattr(conn, "port", 0) or 0), command_names(command)))
            return original(conn, command, *args, **kwargs)

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._original is not None:
            AbstractConnection.send_packed_command = self._original  # type: ignore[method-assign]
            self._original = None

    @contextlib.contextmanager
    def window(self) -> Iterator[List[Send]]:
        """Yields the list that collects the sends of the block (the wrapper is in place only
        for the block: the timed figures run without it)."""
        self.sends = []
        self.install()
        self.on = True
        try:
            yield self.sends
        finally:
            self.on = False
            self.uninstall()


@dataclass
class Send:
    thread: int
    port: int
    commands: List[str]


#: commands whose first argument is a subcommand (counted as ``script|load``, as INFO does)
_CONTAINERS = frozenset({"script", "client", "cluster", "config", "command", "function"})


def command_names(packed: Any) -> List[str]:
    """The commands in one packed RESP payload (a pipeline carries many), lower case."""
    if isinstance(packed, str):
        data = packed.encode()
    elif isinstance(packed, (list, tuple)):
        data = b"".join(bytes(part) for part in packed)
    else:
        data = bytes(packed)
    names: List[str] = []
    i = 0
    try:
        while i < len(data):
            end = data.index(b"\r\n", i)
            argc = int(data[i + 1:end])
            i = end + 2
            head: List[str] = []
            for a in range(argc):
                end = data.index(b"\r\n", i)
                size = int(data[i + 1:end])
                i = end + 2
                if a < 2:
                    head.append(data[i:i + size].decode("latin-1").lower())
                i += size + 2
            if head:
                names.append(f"{head[0]}|{head[1]}" if head[0] in _CONTAINERS and len(head) > 1
                             else head[0])
    except ValueError:
        names.append("?")  # not RESP as redis-py packs it: counted, unnamed
    return names


def tally(names: Sequence[str]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for name in names:
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


COUNTER = SendCounter()


# --- the two topologies ---------------------------------------------------------------------------

@dataclass
class Topology:
    label: str  # "cluster" or "single"
    client: Any  # a redis.RedisCluster or a redis.Redis
    url: str  # what a waiter process connects to (a node's URL for the cluster)
    masters: Dict[int, Any]  # port -> a plain client of that master (for INFO, SCAN)

    def calls(self) -> Dict[int, Dict[str, int]]:
        """INFO commandstats of every master."""
        return {port: C.command_calls(node) for port, node in self.masters.items()}

    def delta(self, before: Dict[int, Dict[str, int]],
              after: Dict[int, Dict[str, int]]) -> Tuple[Dict[str, int], Dict[int, int]]:
        """Commands run between two ``calls()``: by command (summed over the masters) and by
        master (all commands), without the INFO calls and the replicas' REPLCONF."""
        by_cmd: Dict[str, int] = {}
        by_node: Dict[int, int] = {}
        for port in self.masters:
            d = C.calls_delta(before[port], after[port], exclude=NOT_OURS)
            by_node[port] = sum(d.values())
            for cmd, n in d.items():
                by_cmd[cmd] = by_cmd.get(cmd, 0) + n
        return dict(sorted(by_cmd.items(), key=lambda kv: -kv[1])), by_node

    def keys(self) -> List[str]:
        out: List[str] = []
        for node in self.masters.values():
            out += [k.decode() if isinstance(k, bytes) else k for k in node.scan_iter(count=1000)]
        return out


_cluster_clients: Dict[Tuple[str, int], Any] = {}


def cluster_client_for(client: Any) -> Any:
    """``client`` if it is a RedisCluster; else this process' RedisCluster for the node that
    the plain ``client`` talks to (a spawned waiter is handed a node's URL)."""
    if isinstance(client, redis.RedisCluster):
        return client
    kw = client.connection_pool.connection_kwargs
    key = (kw["host"], int(kw["port"]))
    found = _cluster_clients.get(key)
    if found is None:
        found = _cluster_clients[key] = redis.RedisCluster(host=key[0], port=key[1])
    return found


def make_cluster_distlock(client: Any, name: str) -> C.LockHandle:
    """A DistLock on the cluster (module level: spawned waiters unpickle it by reference)."""
    return make_distlock(cluster_client_for(client), name)


def _node_client_for(client: Any, channel: str) -> Any:
    """A plain client of the master that serves ``channel``'s slot."""
    cluster = cluster_client_for(client)
    return cluster.get_redis_connection(cluster.get_node_from_key(channel))


def make_cluster_hint_holder(client: Any, name: str) -> C.LockHandle:
    """The cluster's hop floor, holder's side: ``release()`` is one SPUBLISH, sent to the
    channel's master through that node's plain client (as the single-server floor PUBLISHes
    through a plain client)."""
    channel = f"{name}:floor"
    node = _node_client_for(client, channel)
    return C.LockHandle(lambda t: True, lambda: node.execute_command("SPUBLISH", channel, "1"), obj=channel)


def make_cluster_hint_waiter(client: Any, name: str) -> C.LockHandle:
    """The cluster's hop floor, waiter's side: SSUBSCRIBEd on the channel's master; on the
    message, one EVALSHA of ``return 1`` on that node, as ``_common.make_hint_waiter``."""
    channel = f"{name}:floor"
    node = _node_client_for(client, channel)
    pubsub = node.pubsub()
    pubsub.ssubscribe(channel)
    if (pubsub.get_sharded_message(timeout=10.0) or {}).get("type") != "ssubscribe":
        raise RuntimeError("cluster handoff floor: subscription not confirmed")
    script = node.register_script("return 1")

    def acquire(timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pubsub.get_sharded_message(timeout=max(0.0, deadline - time.monotonic())) is not None:
                script()
                return True
        return False

    return C.LockHandle(acquire, lambda: None, obj=pubsub)


@dataclass
class Ctx:
    knobs: Knobs
    single: Topology
    cluster: Topology
    local: LocalCluster


# --- figure: commands and round trips per acquire + release ------------------------------------

def _count_pairs(topo: Topology, make: Callable[..., Any], name: str, k: Knobs) -> Dict[str, Any]:
    lock = make(name, client=topo.client)
    for _ in range(k.warmup):
        lock.acquire()
        lock.release()
    me = threading.get_ident()
    before = topo.calls()
    with COUNTER.window() as sends:
        for _ in range(k.pairs):
            lock.acquire()
            lock.release()
    after = topo.calls()
    by_cmd, by_node = topo.delta(before, after)
    mine = [send for send in sends if send.thread == me]
    sent = tally([name for send in mine for name in send.commands])
    return {"commands": sum(by_cmd.values()) / k.pairs, "round_trips": len(mine) / k.pairs,
            "by_command": {cmd: n / k.pairs for cmd, n in by_cmd.items()},
            "sent": {cmd: n / k.pairs for cmd, n in sent.items()},
            "by_master": by_node, "other_thread_sends": len(sends) - len(mine), "pairs": k.pairs}


def commands(ctx: Ctx) -> List[Result]:
    k = ctx.knobs
    out: List[Result] = []
    for cls in (DistLock, DistRLock):
        label = cls.__name__
        got: Dict[str, Dict[str, Any]] = {}
        for topo in (ctx.single, ctx.cluster):
            C.eprint(f"commands: {label} on the {topo.label} ({k.warmup} warm-up + {k.pairs} "
                     "acquire+release pairs)")
            got[topo.label] = _count_pairs(topo, cls, f"bench:cmds:{label}", k)
        c, s = got["cluster"], got["single"]
        for what, unit in (("commands", "Redis commands"), ("round_trips", "round trips")):
            ratio = c[what] / s[what] if s[what] else math.nan
            if what == "commands":
                notes = (f"INFO commandstats (summed over the {len(ctx.cluster.masters)} masters), "
                         f"the commands the scripts run inside counted too: cluster "
                         f"{_mix(c['by_command'])}; single {_mix(s['by_command'])}")
            else:
                notes = (f"socket sends of the calling thread; sent: cluster {_mix(c['sent'])}, "
                         f"single {_mix(s['sent'])}")
            stray = c["other_thread_sends"] + s["other_thread_sends"]
            if stray:
                notes += f"; {stray} sends from other threads meanwhile (not counted)"
            out.append(Result(
                f"{unit} per acquire+release, {label}",
                f"cluster {_n(c[what])} / single {_n(s[what])} = {ratio:.2f}x",
                "the same (1.00x)", abs(ratio - 1.0) < 1e-9, notes, ratio, "x",
                {"cluster": c, "single": s}))
    return out


def _mix(by_command: Dict[str, float]) -> str:
    return " + ".join(f"{_n(n)} {cmd.upper()}" for cmd, n in by_command.items()) or "none"


# --- figure: how names spread over the masters -------------------------------------------------

def spread(ctx: Ctx) -> List[Result]:
    k = ctx.knobs
    C.eprint(f"spread: {k.names:,} names over the masters")
    slots = ctx.local.slots()
    owner = [0] * 16384
    for start, end, (_, port), _ in slots:
        for s in range(start, end + 1):
            owner[s] = port
    keys = [DistLock(f"bench:{i}")._keys.lock for i in range(k.names)]  # no client needed
    key_slots = [key_slot(key.encode()) for key in keys]
    # the server agrees on the slots (a sample: one round trip each)
    node = ctx.local.node(ctx.local.ports[0])
    step = max(1, k.names // max(1, k.keyslot_checks))
    wrong = [i for i in range(0, k.names, step)
             if int(node.execute_command("CLUSTER KEYSLOT", keys[i])) != key_slots[i]]
    counts: Dict[int, int] = {port: 0 for port in ctx.local.master_ports()}
    for s in key_slots:
        counts[owner[s]] += 1
    even = k.names / len(counts)
    deviation = max(abs(n - even) for n in counts.values()) / even * 100.0
    slot_share = {port: sum(e - b + 1 for b, e, (_, p), _ in slots if p == port) for port in counts}
    per = ", ".join(f"{n:,}" for n in counts.values())
    notes = (f"per master {per} (even {even:,.0f}); slots per master "
             f"{', '.join(str(n) for n in slot_share.values())}; key e.g. {keys[0]!r}; "
             f"{len(range(0, k.names, step))} slots checked with CLUSTER KEYSLOT"
             + (f", {len(wrong)} DISAGREED" if wrong else ", all agree"))
    return [Result(f"spread of {k.names:,} names over {len(counts)} masters",
                   f"max {deviation:.1f} % from even", "<= 10 %", deviation <= 10.0 and not wrong,
                   notes, deviation, "%",
                   {"per_master": counts, "slots_per_master": slot_share, "keyslot_mismatch": wrong})]


# --- figure: hand-off latency ---------------------------------------------------------------------

FLOOR = "single-server floor"


CLUSTER_FLOOR = "cluster floor (diagnostic)"


def handoff(ctx: Ctx) -> List[Result]:
    k = ctx.knobs
    cands: Dict[str, Tuple[Topology, C.LockFactory, Optional[C.LockFactory]]] = {
        FLOOR: (ctx.single, C.make_hint_holder, C.make_hint_waiter),
        "single DistLock": (ctx.single, make_distlock, None),
        "cluster DistLock": (ctx.cluster, make_cluster_distlock, None),
        CLUSTER_FLOOR: (ctx.cluster, make_cluster_hint_holder, make_cluster_hint_waiter),
    }
    labels = list(cands)
    lat: Dict[str, List[float]] = {label: [] for label in labels}
    round_medians: Dict[str, List[float]] = {label: [] for label in labels}
    failures = {label: 0 for label in labels}
    C.eprint(f"handoff: {k.handoff_rounds} rounds x {len(labels)} candidates x up to "
             f"{k.handoff_samples} samples, round-robin, a fresh waiter process each")
    for rnd in range(k.handoff_rounds):
        for label in C.round_robin(labels, rnd):
            topo, factory, waiter = cands[label]
            res = C.handoff_latency(topo.client, topo.url, factory, f"bench:handoff:{rnd}",
                                    samples=k.handoff_samples, max_seconds=k.handoff_round_max_s,
                                    seed=rnd + 1, waiter_factory=waiter)
            ms = [x * 1000.0 for x in res["latencies"]]
            lat[label] += ms
            round_medians[label].append(C.median(ms))
            failures[label] += res["failures"]

    def vs(label: str, ref: str) -> List[float]:
        return [a / b for a, b in zip(round_medians[label], round_medians[ref])]

    floor = C.median(lat[FLOOR])
    out = [Result("hand-off median: " + FLOOR, f"{floor:.3f} ms", "the reference", None,
                  f"PUBLISH here -> subscribed waiter process + 1 EVALSHA there; p99 "
                  f"{C.percentile(lat[FLOOR], 99):.2f} ms; n={len(lat[FLOOR])}",
                  floor, "ms", {"latencies_ms": lat[FLOOR], "round_medians_ms": round_medians[FLOOR]})]
    for label in labels[1:]:
        med = C.median(lat[label])
        ratios = vs(label, FLOOR)
        notes = (f"{med:.3f} ms; ratio of round medians IQR {C.percentile(ratios, 25):.2f}-"
                 f"{C.percentile(ratios, 75):.2f}; pooled {med / floor:.2f}x; "
                 f"p99 {C.percentile(lat[label], 99):.2f} ms; n={len(lat[label])}")
        if label == "cluster DistLock":
            notes += (f"; cluster / single DistLock {C.median(vs(label, 'single DistLock')):.2f}x, "
                      f"cluster DistLock / cluster floor {C.median(vs(label, CLUSTER_FLOOR)):.2f}x "
                      "(medians of per-round ratios)")
        if label == CLUSTER_FLOOR:
            notes = "SPUBLISH to the channel's master -> SSUBSCRIBEd waiter + 1 EVALSHA there; " + notes
        if failures[label]:
            notes += f"; {failures[label]} acquire timeouts"
        target = {"single DistLock": "side by side", "cluster DistLock": "side by side with single"}
        out.append(Result(f"hand-off median: {label}", f"{C.median(ratios):.2f}x single floor",
                          target.get(label, "-"), None, notes, med, "ms",
                          {"latencies_ms": lat[label], "round_medians_ms": round_medians[label],
                           "round_vs_floor": ratios}))
    return out


# --- figure: the watchdog's round ---------------------------------------------------------------

def _renew_rounds(topo: Topology, k: Knobs, holds: int) -> Dict[str, Any]:
    locks = [DistLock(f"bench:wd:{i}", client=topo.client) for i in range(holds)]
    C.eprint(f"watchdog: {holds:,} holds on the {topo.label}, then {k.renew_rounds} renew_all() rounds")
    taken: List[Any] = []
    rounds: List[Dict[str, Any]] = []
    try:
        for lock in locks:
            if not lock.acquire(timeout=10):
                raise RuntimeError(f"could not take {lock.name!r}")
            taken.append(lock)
        session = locks[0]._session()
        live = sum(1 for h in list(session.holds.values()) if h.watchdog and not h.lost)
        me = threading.get_ident()
        for _ in range(k.renew_rounds):
            before = topo.calls()
            t0 = time.perf_counter()
            with COUNTER.window() as sends:
                retry = session.watchdog.renew_all()
            seconds = time.perf_counter() - t0
            after = topo.calls()
            by_cmd, by_node = topo.delta(before, after)
            mine = [send for send in sends if send.thread == me]
            per_port: Dict[int, int] = {}
            for send in mine:
                per_port[send.port] = per_port.get(send.port, 0) + 1
            setup = sum(1 for send in mine if send.commands and all(n in SETUP for n in send.commands))
            rounds.append({"round_trips": len(mine), "setup_round_trips": setup,
                           "sends_per_port": per_port,
                           "sent": tally([n for send in mine for n in send.commands]),
                           "server_commands": sum(by_cmd.values()), "by_command": by_cmd,
                           "commands_per_master": by_node, "ms": seconds * 1000.0,
                           "retry": retry, "other_thread_sends": len(sends) - len(mine)})
        lost = sum(1 for lock in taken if not lock.owned())
    finally:
        for lock in taken:
            try:
                lock.release()
            except Exception as exc:  # noqa: BLE001 - reported below
                C.eprint(f"watchdog: release of {lock.name!r} failed: {exc!r}")
    return {"rounds": rounds, "holds": holds, "registered": live, "lost": lost}


#: what redis-py sends on a new connection before the first command (not distlock's doing)
SETUP = frozenset({"hello", "auth", "select", "client|setname", "client|setinfo",
                   "client|maint_notifications", "readonly"})


def _round_text(r: Dict[str, Any]) -> str:
    """What one round sent, and what the servers ran for it."""
    inner = r["server_commands"] - sum(n for cmd, n in r["by_command"].items() if cmd in r["sent"])
    setup = (f", {r['setup_round_trips']} of them redis-py's connection set-up"
             if r["setup_round_trips"] else "")
    return (f"sent {_mix(r['sent'])} in {r['round_trips']:,} round trips{setup} "
            f"(per node {sorted(r['sends_per_port'].values())}); the servers ran "
            f"{r['by_command'].get('evalsha', 0):,} EVALSHA, "
            f"{r['by_command'].get('script|exists', 0)} SCRIPT EXISTS, "
            f"{r['by_command'].get('script|load', 0):,} SCRIPT LOAD, {max(0, inner):,} commands "
            f"inside the scripts; {r['ms']:.1f} ms")


def watchdog(ctx: Ctx) -> List[Result]:
    k = ctx.knobs
    got = {topo.label: _renew_rounds(topo, k, k.holds) for topo in (ctx.cluster, ctx.single)}
    c = got["cluster"]
    cold, steady = c["rounds"][0], c["rounds"][1:]
    masters = len(ctx.cluster.masters)
    rtt = [r["round_trips"] for r in steady]
    sent = [sum(r["sent"].values()) for r in steady]
    ok_cmds = all(r["sent"] == {"evalsha": k.holds} and r["by_command"].get("evalsha") == k.holds
                  and not r["by_command"].get("script|exists") for r in steady)
    last = steady[-1] if steady else cold
    out = [
        Result(f"watchdog round trips per round, {k.holds:,} holds",
               f"{_n(C.median(rtt))} (steady rounds: {', '.join(map(str, rtt))})", f"{masters}",
               bool(rtt) and all(n == masters for n in rtt),
               f"one pipeline per master: per node {sorted(last['sends_per_port'].values())}; "
               f"{C.median([r['ms'] for r in steady]):.1f} ms per round; holds live "
               f"{c['registered']:,}, lost {c['lost']}", C.median(rtt), "round trips",
               {"rounds": c["rounds"]}),
        Result(f"watchdog commands per round, {k.holds:,} holds",
               f"{_n(C.median(sent))} sent: {_mix(last['sent'])}",
               f"{k.holds:,} EVALSHA, no SCRIPT EXISTS", bool(steady) and ok_cmds,
               _round_text(last), C.median(sent), "commands"),
        Result("watchdog first round (cold)",
               f"{cold['round_trips'] - cold['setup_round_trips']:,} round trips "
               f"(+ {cold['setup_round_trips']} connection set-up)",
               f"{masters} round trips (+ connection set-up)",
               cold["round_trips"] - cold["setup_round_trips"] == masters,
               "new renewal connections, lock_renew not yet loaded on the nodes: " + _round_text(cold),
               float(cold["round_trips"]), "round trips"),
    ]
    s = got["single"]
    s_last = s["rounds"][-1]
    out.append(Result(f"watchdog round, single server, {k.holds:,} holds (for comparison)",
                      f"{s_last['round_trips']} round trips, {sum(s_last['sent'].values()):,} "
                      "commands sent", "-", None,
                      f"steady: {_round_text(s_last)}; cold round: {_round_text(s['rounds'][0])}",
                      None, "", {"rounds": s["rounds"]}))
    # every hold released: nothing may be left but the fencing counters
    time.sleep(0.2)  # a release whose clean-up was deferred to the watchdog thread
    left = {topo.label: topo.keys() for topo in (ctx.cluster, ctx.single)}
    stray = {label: [key for key in keys if not key.endswith(":fence")] for label, keys in left.items()}
    n_stray = sum(len(v) for v in stray.values())
    fences = sum(len(v) for v in left.values()) - n_stray
    out.append(Result("keys left after releasing everything",
                      f"{n_stray} other than fence keys", "0", n_stray == 0,
                      f"{fences:,} fence keys (kept on purpose) on the cluster and the single server"
                      + (f"; e.g. {sorted(sum(stray.values(), []))[:5]}" if n_stray else ""),
                      float(n_stray), "keys", {"stray": stray}))
    return out


# --- main ---------------------------------------------------------------------------------------

def _run(ctx: Ctx, figures: List[str]) -> List[Result]:
    results: List[Result] = []
    if "commands" in figures:
        results += commands(ctx)
    if "spread" in figures:
        results += spread(ctx)
    if "handoff" in figures:
        results += handoff(ctx)
    if "watchdog" in figures:
        results += watchdog(ctx)
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("figures", nargs="*", metavar="figure",
                        help=f"figures to run (default: all): {', '.join(FIGURES)}")
    parser.add_argument("--quick", action="store_true", help="a short smoke run (< 60 s)")
    parser.add_argument("--json", metavar="PATH", help="also write every figure and sample as JSON")
    parser.add_argument("--holds", type=int, help="watchdog: holds (default 1,000; quick 300)")
    args = parser.parse_args(argv)
    unknown = [f for f in args.figures if f not in FIGURES]
    if unknown:
        parser.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(FIGURES)}")
    chosen = [f for f in FIGURES if f in args.figures] if args.figures else list(FIGURES)
    knobs = QUICK if args.quick else FULL
    if args.holds:
        knobs = replace(knobs, holds=max(1, args.holds))

    started = time.monotonic()
    single_server = cluster = None
    clients: List[Any] = []
    try:
        C.eprint("starting a redis-server and a cluster of 3 masters + 3 replicas")
        single_server = C.start_server()
        cluster = LocalCluster()
        single_client = C.connect(single_server.url)
        cluster_client = cluster.client()
        clients += [single_client, cluster_client]
        ctx = Ctx(knobs,
                  Topology("single", single_client, single_server.url, {single_server.port: single_client}),
                  Topology("cluster", cluster_client, f"redis://127.0.0.1:{cluster.ports[0]}/0",
                           {port: cluster.node(port) for port in cluster.master_ports()}),
                  cluster)
        info = single_client.info("server")
        meta: Dict[str, Any] = {
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "figures": chosen, "quick": args.quick, "knobs": knobs.__dict__,
            "python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "distlock": distlock.__version__,
            "redis_py": redis.__version__, "redis_version": info.get("redis_version"),
            "single_port": single_server.port, "cluster_ports": cluster.ports,
            "cluster_masters": cluster.master_ports(),
        }
        results = _run(ctx, chosen)
    finally:
        COUNTER.uninstall()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
        reset_sessions()
        if cluster is not None:
            cluster.stop()
        if single_server is not None:
            single_server.stop()
    meta["seconds"] = round(time.monotonic() - started, 1)
    print(f"distlock on a Redis Cluster (3 masters + 3 replicas) vs one server: redis "
          f"{meta['redis_version']}, redis-py {meta['redis_py']}, Python {meta['python']}, "
          f"{meta['cpus']} CPUs; {meta['seconds']} s"
          f"{' (--quick: hand-off numbers are not meaningful)' if args.quick else ''}")
    print(format_results(results))
    missed = [r.figure for r in results if r.met is False]
    if missed:
        print(f"\nmissed: {'; '.join(missed)}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(C.json_clean({"meta": meta, "rows": [asdict(r) for r in results]}), fh, indent=2)
            fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
