"""``distlock run --leader NAME -- CMD`` (distlock/_cli/leader.py), through real subprocesses
(``python -m distlock``) against the fixture's redis-server, as in ``test_cli.py``.

CMD runs on one ``run --leader`` at a time; when it ends, its ``run`` resigns and exits with
CMD's status, and the next campaign wins. The epoch is in ``$DISTLOCK_EPOCH``. Bad input gets
``run``'s exit statuses. No timing is asserted: the order of events is checked through a file
the commands append to and an exclusive-create marker held while a command runs. Child
processes are killed in ``finally``; the ``client`` fixture flushes the database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
import redis
from _support import kill, read_line, settle

from distlock import DistElection, DistSemaphore
from distlock._cli import main as _cli
from distlock.testing.server import free_port

TIMEOUT = 60  # seconds: the bound of every subprocess call here

# The leader's command: says "ready" (with its epoch), holds an exclusive-create marker while it
# runs (a second command inside at the same time fails to create it and exits 99), appends its
# start and end to a log, waits for GATE to exist (if given), and exits with STATUS.
LEADER_CMD = """
import os, sys, time
log, inside, gate, status = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
epoch, token = os.environ["DISTLOCK_EPOCH"], os.environ["DISTLOCK_TOKEN"]
def note(what):
    with open(log, "a") as f:
        f.write(f"{what} {os.getpid()} {epoch} {token} {os.environ['DISTLOCK_NAME']}\\n")
try:
    os.close(os.open(inside, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
except FileExistsError:
    note("overlap")
    sys.exit(99)
note("start")
print("ready", epoch, flush=True)
deadline = time.monotonic() + 60
while gate != "-" and not os.path.exists(gate) and time.monotonic() < deadline:
    time.sleep(0.02)
note("end")
os.unlink(inside)
sys.exit(status)
"""

SLEEPING_CMD = "import time; print('ready', flush=True); time.sleep(60)"


def _env(url: Optional[str] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTLOCK_")}
    if url is not None:
        env["DISTLOCK_URL"] = url
    return env


def cli(*args: str, url: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distlock", *args], env=_env(url),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=TIMEOUT)


def start(*args: str, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "distlock", *args], env=_env(url),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT)
    return proc.returncode, out, err


def one_line_error(stderr: str) -> str:
    assert "Traceback" not in stderr
    return [line for line in stderr.splitlines() if line.strip()][-1]


def _leader(name: str, tmp: Path, gate: str, status: int, *options: str,
            url: str) -> subprocess.Popen[str]:
    return start("run", "--leader", name, *options, "--url", url, "--", sys.executable, "-c",
                 LEADER_CMD, str(tmp / "log"), str(tmp / "inside"), gate, str(status), url=url)


@pytest.mark.real_redis
def test_one_leader_runs_at_a_time_and_the_next_starts_when_its_command_ends(
        url: str, client: redis.Redis[Any], tmp_path: Path) -> None:
    name = f"leader-{uuid.uuid4().hex[:8]}"
    gate = tmp_path / "gate"
    first = _leader(name, tmp_path, str(gate), 3, "--value", "first", url=url)
    second: Optional[subprocess.Popen[str]] = None
    try:
        ready, epoch = read_line(first).split()
        assert ready == "ready"
        led = DistElection(name, client=client).leader()
        assert led is not None and (led.value, led.epoch, led.pid) == ("first", int(epoch), first.pid)
        second = _leader(name, tmp_path, "-", 4, url=url)
        # the second campaigns (it is registered as waiting) while the first's command runs
        assert settle(lambda: client.exists(f"distlock:{{{name}}}:q"), 30)
        assert second.poll() is None
        gate.touch()
        status, _, err = finish(first)
        assert status == 3, err
        status, out, err = finish(second)
        assert status == 4, err
        assert out.split()[0] == "ready"
    finally:
        kill(first)
        if second is not None:
            kill(second)
    lines = [line.split() for line in (tmp_path / "log").read_text().splitlines()]
    assert [line[0] for line in lines] == ["start", "end", "start", "end"], lines
    assert lines[0][1] == lines[1][1] != lines[2][1] == lines[3][1]  # one command, then the other
    assert all(line[4] == name for line in lines)
    # the epoch is exported, equal to the token, and strictly greater for the next leader
    assert all(line[2] == line[3] for line in lines)
    assert 0 < int(lines[0][2]) < int(lines[2][2])
    assert DistElection(name, client=client).leader() is None  # both resigned


@pytest.mark.real_redis
def test_epoch_is_exported_and_grows_and_a_lost_leadership_stops_the_command(
        url: str, client: redis.Redis[Any]) -> None:
    name = f"leader-{uuid.uuid4().hex[:8]}"
    show = "import os, sys; print(os.environ['DISTLOCK_EPOCH'], os.environ['DISTLOCK_TOKEN']); sys.exit(7)"
    epochs: List[int] = []
    for _ in range(2):
        result = cli("run", "--leader", name, "--url", url, "--", sys.executable, "-c", show)
        assert result.returncode == 7, result.stderr
        epoch, token = result.stdout.split()
        assert epoch == token
        epochs.append(int(epoch))
    assert 0 < epochs[0] < epochs[1]
    # a broken leadership stops the command as a lost lock does: SIGTERM, exit 76
    proc = start("run", "--leader", name, "--url", url, "--", sys.executable, "-c", SLEEPING_CMD,
                 url=url)
    try:
        assert read_line(proc) == "ready"
        forced = cli("release", "--force", name, "--url", url)
        assert forced.returncode == 0, forced.stderr
        status, _, err = finish(proc)
        assert status == 76, err
        assert f"lost the leadership of {name!r}" in err
    finally:
        kill(proc)


# --- bad input: the statuses of a plain run ---------------------------------------------------

@pytest.mark.parametrize("args", [
    ["run", "--leader", "x"],                                     # no COMMAND
    ["run", "--leader"],                                          # no NAME
    ["run", "--leader", "x", "--timeout", "-1", "--", "true"],
    ["run", "--leader", "x", "--shared", "--", "true"],
    ["run", "--leader", "x", "--write", "--", "true"],
    ["run", "x", "--value", "v", "--", "true"],                   # --value without --leader
    ["run", "--leader", "x", "--value", "v" * 1025, "--", "true"],
])
def test_bad_arguments_exit_2_with_a_usage_error(
        args: List[str], capsys: pytest.CaptureFixture[str]) -> None:
    """In process (argparse's exit, before anything connects), to keep the file fast."""
    with pytest.raises(SystemExit) as exc:
        _cli.main([*args[:1], "--url", "redis://127.0.0.1:1/0", *args[1:]])
    assert exc.value.code == 2
    assert "error:" in one_line_error(capsys.readouterr().err)


def test_unreachable_server_exits_69_as_run_does() -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    for leader in ([], ["--leader"]):
        result = cli("run", *leader, "x", "--url", url, "--", sys.executable, "-c", "pass")
        assert result.returncode == 69, result.stderr
        assert url in one_line_error(result.stderr)


@pytest.mark.real_redis
def test_not_elected_in_time_and_a_name_of_another_kind_exit_as_run_does(
        url: str, client: redis.Redis[Any]) -> None:
    name = f"leader-{uuid.uuid4().hex[:8]}"
    election = DistElection(name, client=client)
    leadership = election.campaign("holder")
    try:
        refused = cli("run", "--leader", name, "--nonblock", "--url", url, "--", "true")
        assert refused.returncode == 75, refused.stderr
        assert "'holder'" in one_line_error(refused.stderr)
        custom = cli("run", "--leader", name, "--timeout", "0.2", "-E", "9", "--url", url, "--",
                     "true")
        assert custom.returncode == 9, custom.stderr
    finally:
        leadership.resign()
    sem = DistSemaphore(f"{name}:sem", 1, client=client)
    assert sem.acquire()
    try:
        for leader in ([], ["--leader"]):
            other = cli("run", *leader, "-n", f"{name}:sem", "--url", url, "--", "true")
            assert other.returncode == 65, other.stderr
            assert "DistSemaphore" in one_line_error(other.stderr)
    finally:
        sem.release()


@pytest.mark.real_redis
def test_a_signal_while_campaigning_ends_run_with_128_plus_n(
        url: str, client: redis.Redis[Any]) -> None:
    """SIGTERM while waiting to be elected: no command started, exit 128 + 15, as ``run``."""
    if not hasattr(signal, "SIGTERM"):
        pytest.skip("no SIGTERM here")
    name = f"leader-{uuid.uuid4().hex[:8]}"
    election = DistElection(name, client=client)
    leadership = election.campaign("holder")
    proc = start("run", "--leader", name, "--url", url, "--", sys.executable, "-c", "pass",
                 url=url)
    try:
        assert settle(lambda: client.exists(f"distlock:{{{name}}}:q"), 30)
        proc.send_signal(signal.SIGTERM)
        status, _, err = finish(proc)
        assert status == 128 + signal.SIGTERM, err
    finally:
        kill(proc)
        leadership.resign()
