"""bot.engine.owner: a run's owner is alive only while its process can still drive it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from bot.engine.owner import owner_alive, process_owner, read_stat

HOST = socket.gethostname()


def _owner_of(pid: int) -> str:
    stat = read_stat(pid)
    assert stat is not None
    return f"{HOST}:{pid}:{stat.start_time}"


def test_this_process_is_alive() -> None:
    assert owner_alive(process_owner())


def test_a_live_child_is_alive_and_a_reaped_one_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    owner = _owner_of(child.pid)
    try:
        assert owner_alive(owner)
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert not owner_alive(owner)


def test_a_zombie_owner_is_dead() -> None:
    # The bug of issue 9: a killed bot whose parent has not reaped it yet still has a
    # /proc entry with its start time, in state Z. It must count as dead.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    owner = _owner_of(child.pid)
    assert child.stdin is not None
    child.stdin.close()  # it exits; we do not wait(), so it stays a zombie
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while (stat := read_stat(child.pid)) is not None and stat.state != "Z":
        assert datetime.now(UTC) < deadline, "child never became a zombie"
        os.sched_yield()
    try:
        assert read_stat(child.pid) is not None  # the entry is still there...
        assert not owner_alive(owner)  # ...and it is dead all the same
    finally:
        child.wait()


def test_a_reused_pid_is_dead() -> None:
    pid = os.getpid()
    assert not owner_alive(f"{HOST}:{pid}:1")  # same PID, another start time


def test_garbage_and_missing_owners_are_dead() -> None:
    for owner in (None, "", "nonsense", f"{HOST}:x:1", f"{HOST}:999999999:1"):
        assert not owner_alive(owner), owner


def test_an_owner_elsewhere_is_judged_by_its_lease() -> None:
    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    elsewhere = "other-host.example:4242:123"
    assert owner_alive(elsewhere, lease_until=now + timedelta(seconds=5), now=now)
    assert not owner_alive(elsewhere, lease_until=now - timedelta(seconds=1), now=now)
    assert not owner_alive(elsewhere, lease_until=now, now=now)  # expired at its end
    assert not owner_alive(elsewhere)  # no lease written: nothing says it is alive


def test_a_proc_stat_with_spaces_and_parens_in_the_name(tmp_path: Path) -> None:
    # The command name (field 2) may hold spaces and ')': the fields after it still count.
    (tmp_path / "77").mkdir()
    rest = " ".join(["S", *map(str, range(4, 22)), "555", "0"])
    (tmp_path / "77" / "stat").write_text(f"77 (evil) name (x) {rest}\n")
    stat = read_stat(77, tmp_path)
    assert stat is not None and (stat.state, stat.start_time) == ("S", "555")
    assert owner_alive(f"{HOST}:77:555", proc=tmp_path)
    (tmp_path / "77" / "stat").write_text(f"77 (evil) name (x) {rest.replace('S', 'Z', 1)}\n")
    assert not owner_alive(f"{HOST}:77:555", proc=tmp_path)
