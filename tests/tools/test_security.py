"""Security: least-privilege ACL, password, TLS, unguessable owners (issue 7).

- A Redis ACL user with exactly the rule in ``docs/security_acl.txt`` (keys and channels
  ``distlock:*``, only the commands the library sends or its scripts run) can use every
  primitive; the server logs no refusal; and the rule names no command the library never uses
  (each is either seen in INFO commandstats during the same workload, or called by a script).
- A password in the URL works; a wrong one raises AuthenticationError, never False.
- A ``rediss://`` URL works against a redis-server with a self-signed certificate that this
  test makes with ``openssl`` (skipped, with the reason, when redis-server lacks TLS).
- Owner ids are random per session; one session can never release, extend or renew another's
  hold, through the API or by calling the scripts with what it can guess.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
import uuid
from typing import Any, Iterator, List, Set

import faults
import pytest
import redis
from faults import PRIMITIVES

import distlock
from distlock import LockNotOwnedError
from distlock._redis import pubsub as _pubsub
from distlock._redis import urls
from distlock._session import config as _config
from distlock._session.session import reset_sessions, session_for
from distlock.testing.server import RedisServer, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
ACL_DOC = os.path.join(HERE, os.pardir, os.pardir, "docs", "security_acl.txt")
LUA_DIR = os.path.join(HERE, os.pardir, os.pardir, "distlock", "_redis", "lua")

KINDS = sorted(PRIMITIVES)

#: Commands a connection handshake may send and whose refusal redis-py ignores.
HANDSHAKE = {"client|setinfo"}


def acl_rule() -> List[str]:
    """The ACL SETUSER arguments of the documented rule (after the user name)."""
    with open(ACL_DOC, encoding="utf-8") as fh:
        lines = [line.strip() for line in fh if line.startswith("ACL SETUSER ")]
    assert len(lines) == 1, "docs/security_acl.txt must hold exactly one ACL SETUSER line"
    return lines[0].split()[3:]


def rule_commands(rule: List[str]) -> Set[str]:
    return {word[1:].lower() for word in rule if word.startswith("+")}


def lua_commands() -> Set[str]:
    found: Set[str] = set()
    for entry in os.listdir(LUA_DIR):
        if entry.endswith(".lua"):
            with open(os.path.join(LUA_DIR, entry), encoding="utf-8") as fh:
                found |= {m.lower() for m in re.findall(r"redis\.p?call\(\s*'([A-Za-z]+)'", fh.read())}
    return found


#: The workload's lease, renewed every 0.15 s: 2.85 s of slack for a late renewal. With a 1 s
#: lease, a README run on a loaded machine saw a TLS client's hold run out unrenewed, and with
#: 2 s a 3.9 run beside four other suites (load average 16) saw it again.
WORK_LEASE = 3.0
WORK_SETTINGS = {"lease": WORK_LEASE, "renew_interval": 0.15, "wait_cap": 0.5}


def workload(client: Any, kind: str, tag: str) -> None:
    """Every operation of primitive ``kind`` a user makes: free and contended acquires (with the
    pub/sub wait), re-entry, try_lock, locked, explicit and watchdog leases with renewals, a
    release after SCRIPT FLUSH... and for a condition, wait and notify."""
    make = PRIMITIVES[kind].make
    name = f"sec-{tag}-{kind}"
    holder = make(name, client, None)
    assert holder.acquire(timeout=5)
    if PRIMITIVES[kind].reentrant:
        assert holder.acquire(blocking=False)
        holder.release()
    results: List[bool] = []

    def contend() -> None:
        other = PRIMITIVES[kind].rival(name, client, 2.0)
        got = other.acquire(timeout=10)
        results.append(got)
        if got:
            other.release()

    waiter = threading.Thread(target=contend)
    waiter.start()
    session = session_for(_config.resolve_client(client))
    faults.wait_until(lambda: any(f"{{{name}}}" in ch for ch in session.subscribed_channels())
                      or not waiter.is_alive(), 10)
    time.sleep(WORK_LEASE + 0.3)  # past one lease: only the watchdog's renewals keep the hold
    holder.release()
    waiter.join(15)
    assert results == [True]
    leased = make(f"{name}-lease", client, 5.0)
    assert leased.acquire(blocking=False)
    assert leased.token is not None and leased.owned()
    leased.release()
    if hasattr(holder, "try_lock"):
        assert holder.try_lock(0.1, lease=2.0)
        holder.release()
    if hasattr(holder, "locked"):
        assert holder.locked() is False
    if hasattr(holder, "cond"):  # a condition: wait, notify, notify_all
        _condition_workload(client, holder.cond, make, name)
    if hasattr(distlock, "DistReadWriteLock") and kind.startswith("DistReadWriteLock"):
        rw = distlock.DistReadWriteLock(f"{name}-rw", client=client)  # type: ignore[attr-defined]
        reader = rw.read_lock()
        assert reader.acquire(timeout=5)
        assert reader.locked()
        blocked = rw.write_lock()
        outcome: List[bool] = []
        writer = threading.Thread(target=lambda: outcome.append(blocked.acquire(timeout=0.5)))
        writer.start()  # a writer that waits, then gives up its place
        writer.join(10)
        assert outcome == [False]
        time.sleep(WORK_LEASE + 0.3)  # past one lease: the reader's renewals keep it
        reader.release()


def _condition_workload(client: Any, cond: Any, make: Any, name: str) -> None:
    woke: List[bool] = []

    def wait() -> None:
        other = distlock.DistCondition(name, client=client)  # type: ignore[attr-defined]
        with other:
            woke.append(other.wait(timeout=10))

    threads = [threading.Thread(target=wait) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    with cond:
        cond.notify(1)
    time.sleep(0.3)
    with cond:
        cond.notify_all()
    for t in threads:
        t.join(15)
    assert len(woke) == 2


def sync_workload(client: Any, tag: str) -> None:
    """Every operation of DistSemaphore, DistBoundedSemaphore, DistEvent and DistBarrier: free
    and contended acquires with their waits, watchdog renewals, explicit leases (one that runs
    out, whose release finds it lost), a release on another holder's behalf, a count raised
    above the value, a value mismatch (which reads the recorded value); an event's wait, set,
    is_set, clear; a barrier's trips with an action (a waiting party's lease renewed), a
    timeout that breaks it, abort, reset, n_waiting, broken."""
    if not all(hasattr(distlock, k) for k in ("DistSemaphore", "DistBoundedSemaphore",
                                              "DistEvent", "DistBarrier")):
        return
    sem_name, ev_name, bar_name = f"sec-{tag}-sem", f"sec-{tag}-ev", f"sec-{tag}-bar"
    for cls in (distlock.DistSemaphore, distlock.DistBoundedSemaphore):
        name = f"{sem_name}-{cls.__name__}"
        sem = cls(name, 2, client=client)
        assert sem.acquire(timeout=5) and sem.acquire(timeout=5)
        got: List[bool] = []

        def contend(cls: Any = cls, name: str = name, got: List[bool] = got) -> None:
            other = cls(name, 2, client=client)
            ok = other.acquire(timeout=10)
            got.append(ok)
            if ok:
                other.release()

        waiter = threading.Thread(target=contend)
        waiter.start()
        time.sleep(0.4)  # the waiter queues; watchdog renewals (every 0.15 s)
        sem.release()
        waiter.join(15)
        assert got == [True]
        sem.release()
        assert sem.acquire(blocking=False)
        with pytest.raises(ValueError, match="created with value 2"):  # reads the recorded value
            cls(name, 3, client=client).acquire(blocking=False)
        sem.release()
        short = cls(name, 2, client=client, lease=0.5)
        assert short.acquire(blocking=False)
        time.sleep(0.6)  # its lease runs out
        with pytest.raises(distlock.LockLostError):
            short.release()
        held = cls(name, 2, client=client, lease=5.0)
        assert held.acquire(blocking=False)
        # Another session (another process, as far as distlock knows) holds nothing: its
        # release gives back the permit held here, on its owner's behalf.
        stranger = cls(name, 2, client=redis.Redis(connection_pool=client.connection_pool))
        stranger.release()
        if cls is distlock.DistSemaphore:
            stranger.release()  # raises the count above the value: state, for good
            assert all(stranger.acquire(blocking=False) for _ in range(3))
            stranger.release(3)
    event = distlock.DistEvent(ev_name, client=client)
    woke: List[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(
        distlock.DistEvent(ev_name, client=client).wait(10)))
    waiter.start()
    time.sleep(0.3)
    assert event.is_set() is False
    event.set()
    waiter.join(15)
    assert woke == [True] and event.wait(0) is True
    event.clear()
    assert event.wait(0.2) is False
    runs: List[int] = []
    indices: List[int] = []
    barrier = distlock.DistBarrier(bar_name, 2, action=lambda: runs.append(1), client=client)
    for _ in range(2):
        party = threading.Thread(target=lambda: indices.append(
            distlock.DistBarrier(bar_name, 2, action=lambda: runs.append(1), client=client).wait(10)))
        party.start()
        time.sleep(0.4)  # the party waits; its lease is renewed (every 0.15 s)
        assert barrier.n_waiting == 1
        indices.append(barrier.wait(10))
        party.join(15)
    assert sorted(indices) == [0, 0, 1, 1] and runs == [1, 1]
    with pytest.raises(threading.BrokenBarrierError):
        barrier.wait(0.1)  # a timeout breaks it
    assert barrier.broken is True
    barrier.reset()
    barrier.abort()
    barrier.reset()
    assert barrier.broken is False


def full_workload(client: Any, admin: Any, tag: str) -> None:
    distlock.configure(**WORK_SETTINGS)  # type: ignore[arg-type]
    for kind in KINDS:
        workload(client, kind, tag)
    sync_workload(client, tag)
    admin.script_flush()  # the NOSCRIPT paths (SCRIPT LOAD, and SCRIPT EXISTS in renewals)
    workload(client, KINDS[0], tag + "-flushed")
    time.sleep(0.6)  # idle channels are unsubscribed (UNSUBSCRIBE_AFTER is patched short)


@pytest.fixture
def short_unsubscribe(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_pubsub, "UNSUBSCRIBE_AFTER", 0.2)


@pytest.fixture
def private_server(client: Any) -> Iterator[RedisServer]:
    """A redis-server of this test alone (ACL users and passwords must not leak into others)."""
    server = RedisServer()
    try:
        yield server
    finally:
        reset_sessions()
        server.stop()


# --- ACL --------------------------------------------------------------------------------------

@pytest.mark.real_redis
@pytest.mark.slow
def test_least_privilege_acl_user_can_use_every_primitive(
        private_server: RedisServer, short_unsubscribe: None) -> None:
    admin = redis.Redis.from_url(private_server.url)
    rule = acl_rule()
    password = uuid.uuid4().hex
    args = [">" + password if word.startswith(">") else word for word in rule]
    admin.execute_command("ACL", "SETUSER", "dl", *args)
    admin.execute_command("ACL", "SETUSER", "dlall", "on", ">" + password, "~*", "&*", "+@all")
    admin.execute_command("ACL", "LOG", "RESET")

    # 1. With every permission: which commands does the workload send (scripts' included)?
    admin.config_resetstat()
    full = redis.Redis(host="127.0.0.1", port=private_server.port, username="dlall", password=password)
    full_workload(full, admin, "all")
    reset_sessions()
    used = {name[len("cmdstat_"):] for name in admin.info("commandstats")}
    used -= {"config|resetstat", "script|flush", "info", "acl|setuser", "acl|log", "auth", "hello",
             "client|setinfo",
             "config|get"}  # counted by valkey-server 9 inside the admin's SCRIPT FLUSH

    # 2. With the documented rule: everything works, and the server refused nothing.
    limited = redis.Redis(host="127.0.0.1", port=private_server.port, username="dl", password=password)
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.set("not-distlock", 1)
    with pytest.raises(redis.exceptions.NoPermissionError):
        limited.eval("return 1", 0)
    admin.execute_command("ACL", "LOG", "RESET")
    full_workload(limited, admin, "limited")
    reset_sessions()
    refusals = [entry for entry in admin.acl_log()
                if entry.get("object") not in HANDSHAKE]
    assert refusals == [], f"the documented ACL rule is not enough: {refusals}"

    # 3. Minimal: each command of the rule is used by the workload or run by a script.
    allowed = rule_commands(rule)
    assert used <= allowed, f"commands used but not in the rule: {used - allowed}"
    unused = allowed - used - lua_commands()
    assert not unused, f"the rule allows commands nothing uses: {unused}"
    missing = lua_commands() - allowed
    assert not missing, f"scripts call commands the rule does not allow: {missing}"
    assert "~distlock:*" in rule and "&distlock:*" in rule and "-@all" in rule


# --- password ---------------------------------------------------------------------------------

@pytest.mark.real_redis
def test_password_in_url(client: Any) -> None:
    password = uuid.uuid4().hex
    with RedisServer() as server:  # started open (its readiness check is a plain PING), then:
        redis.Redis.from_url(server.url).config_set("requirepass", password)
        good = f"redis://:{password}@127.0.0.1:{server.port}/0"
        try:
            distlock.configure(**WORK_SETTINGS)  # type: ignore[arg-type]
            for kind in KINDS:
                lock = PRIMITIVES[kind].make(f"pw-{kind}", good, None)
                assert lock.acquire(timeout=5)
                time.sleep(0.3)
                assert lock.owned()
                lock.release()
            for bad in (f"redis://:wrong@127.0.0.1:{server.port}/0", server.url):
                lock = distlock.DistLock("pw-bad", client=bad)
                with pytest.raises(redis.exceptions.AuthenticationError):
                    lock.acquire(blocking=False)
        finally:
            reset_sessions()
            for url in list(urls._url_clients):
                if f":{server.port}/" in url:
                    urls._url_clients.pop(url).close()


# --- TLS --------------------------------------------------------------------------------------

def _make_certificate(directory: str) -> Any:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not on PATH: cannot make a test certificate")
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return cert, key


@pytest.mark.real_redis
def test_tls_url(client: Any, tmp_path: Any) -> None:
    cert, key = _make_certificate(str(tmp_path))
    tls_port = free_port()
    try:
        server = RedisServer(extra_args=[
            "--tls-port", str(tls_port), "--tls-cert-file", cert, "--tls-key-file", key,
            "--tls-ca-cert-file", cert, "--tls-auth-clients", "no"])
    except RuntimeError as exc:
        if "tls" in str(exc).lower() or "TLS" in str(exc):
            pytest.skip(f"this redis-server was built without TLS: {exc}")
        raise
    url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={cert}&ssl_cert_reqs=required"
    try:
        distlock.configure(**WORK_SETTINGS)  # type: ignore[arg-type]
        for kind in KINDS:
            workload(url, kind, "tls")  # type: ignore[arg-type]
        plain_on_tls = redis.Redis(host="127.0.0.1", port=tls_port, socket_timeout=2)
        with pytest.raises(redis.exceptions.ConnectionError):
            plain_on_tls.ping()
        plain_on_tls.close()
    finally:
        reset_sessions()
        cached = urls._url_clients.pop(url, None)
        if cached is not None:
            cached.close()
        server.stop()


# --- owners -----------------------------------------------------------------------------------

def test_owner_ids_are_random_per_session(backend: Any, client: Any) -> None:
    others = [backend.client() for _ in range(3)]
    try:
        ids = [session_for(c).id for c in [client, *others]]
        assert len(set(ids)) == len(ids)
        assert all(re.fullmatch(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}", i) for i in ids), ids
        # DistLock: a fresh random owner per hold, after the session id.
        owners = set()
        for _ in range(3):
            lock = distlock.DistLock("owner-ids", client=client)
            assert lock.acquire(blocking=False)
            fields = {k for k in client.hkeys("distlock:{owner-ids}") if not k.startswith(b":")}
            lock.release()
            assert len(fields) == 1
            owner = fields.pop().decode()
            assert owner.startswith(ids[0] + ":")
            owners.add(owner)
        assert len(owners) == 3
    finally:
        for other in others:
            other.close()


@pytest.mark.parametrize("kind", KINDS)
def test_one_session_cannot_touch_anothers_hold(backend: Any, client: Any, kind: str) -> None:
    make = PRIMITIVES[kind].make
    name = f"xs-{kind}"
    mine = make(name, client, 30.0)
    assert mine.acquire(blocking=False)
    token = mine.token
    intruder_client = backend.client()
    try:
        theirs = PRIMITIVES[kind].rival(name, intruder_client, 30.0)
        with pytest.raises(LockNotOwnedError):
            theirs.release()
        assert theirs.acquire(blocking=False) is False
        if hasattr(theirs, "try_lock"):
            assert theirs.try_lock(0.05) is False
        assert not theirs.owned() and theirs.token is None
        assert mine.owned() and mine.token == token
    finally:
        intruder_client.close()
    mine.release()


@pytest.mark.parametrize("kind", ["DistLock", "DistRLock"])
def test_scripts_refuse_guessed_owners(backend: Any, client: Any, kind: str) -> None:
    """What another session can guess (its own ids, the holder's session id with another thread
    or suffix, a wrong token) never releases, re-enters, extends or renews the hold."""
    make = PRIMITIVES[kind].make
    name = f"guess-{kind}"
    mine = make(name, client, 30.0)
    assert mine.acquire(blocking=False)
    key, channel = f"distlock:{{{name}}}", f"distlock:{{{name}}}:wake"
    token = str(mine.token)
    owner = next(k.decode() for k in client.hkeys(key) if not k.startswith(b":"))
    session_id = owner.split(":")[0]
    intruder_client = backend.client()
    try:
        intruder = session_for(intruder_client)
        guesses = [
            (f"{intruder.id}:{threading.get_ident()}", token),
            (f"{session_id}:{threading.get_ident() + 1}", token),
            (f"{session_id}:000000000000", token),
            (owner, str(int(token) - 1)),
            (owner, str(int(token) + 1)),
            (owner, ""),
        ]
        before = client.hgetall(key)
        for who, tok in guesses:
            client.pexpire(key, 30_000)
            assert intruder.run("lock_release", (key, channel), (who, tok, "0")) == -1
            assert intruder.run("lock_renew", (key,), (who, tok, 3_600_000)) == 0
            if tok:
                assert intruder.run("lock_acquire", (key, f"{key}:fence"),
                                    (who, 3_600_000, 1, "x:1", tok)) <= 0
            assert client.hgetall(key) == before
            assert client.pttl(key) <= 30_000, "someone else's guess extended the hold"
        assert mine.owned()
    finally:
        intruder_client.close()
    mine.release()
