"""bot.engine.owner: a run's owner is judged by its process only where this process sees
the same PIDs (the same boot and PID namespace, issue 17 F3), and there it is alive only
while its process can still drive the run; anywhere else the heartbeat decides.

The PID-namespace tests run the real bot code under ``unshare --pid --fork --mount-proc``
(util-linux) against one SQLite file, the judge on the other side of the namespace
boundary with the same hostname; the hidepid test mounts a real /proc with
``hidepid=2`` and judges as ``nobody``."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from bot.audit import AuditLog
from bot.core.plan import make_plan
from bot.core.status import Action, RunStatus, Source
from bot.engine.clocks import Monotonic
from bot.engine.heartbeat import LEASE_S, RENEW_EVERY_S
from bot.engine.lifecycle import RunLifecycle
from bot.engine.owner import (
    NOWHERE,
    Namespace,
    Owner,
    ProcessSays,
    boot_id,
    judge_process,
    parse_owner,
    proc_is_ours,
    process_owner,
    read_stat,
    this_namespace,
)
from bot.errors import LockHeldError
from tests.polling import eventually
from tests.support import ns_process
from tests.support.cli import REPO_ROOT
from tests.support.clock import ManualClock
from tests.support.wall_clock import ManualWallClock

HOST = socket.gethostname()
HERE = this_namespace()
ALIVE, DEAD, NOTHING = ProcessSays.ALIVE, ProcessSays.DEAD, ProcessSays.NOTHING


def _owner_of(pid: int) -> str:
    stat = read_stat(pid)
    assert stat is not None
    return str(Owner(HOST, pid, stat.start_time, HERE))


def test_this_process_is_alive() -> None:
    assert HERE.known, "this machine shows its boot id and PID namespace"
    assert judge_process(process_owner(), HERE) is ALIVE


def test_a_live_child_is_alive_and_a_reaped_one_is_dead() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    owner = _owner_of(child.pid)
    try:
        assert judge_process(owner, HERE) is ALIVE
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert judge_process(owner, HERE) is DEAD


def test_a_zombie_owner_is_dead() -> None:
    # The bug of issue 9: a killed bot whose parent has not reaped it yet still has a
    # /proc entry with its start time, in state Z. It must count as dead.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    owner = _owner_of(child.pid)
    assert child.stdin is not None
    child.stdin.close()  # it exits; we do not wait(), so it stays a zombie
    deadline = datetime.now(UTC) + timedelta(seconds=10)
    while (stat := read_stat(child.pid)) is not None and stat.state != "Z":
        assert datetime.now(UTC) < deadline, "child never became a zombie"
        os.sched_yield()
    try:
        assert read_stat(child.pid) is not None  # the entry is still there...
        assert judge_process(owner, HERE) is DEAD  # ...and it is dead all the same
    finally:
        child.wait()


def test_a_reused_pid_is_dead() -> None:
    pid = os.getpid()
    assert judge_process(str(Owner(HOST, pid, "1", HERE)), HERE) is DEAD  # another start


def test_garbage_missing_and_old_owners_say_nothing_so_the_heartbeat_decides() -> None:
    # Nothing in these says which PID namespace the PID belongs to (or there is no PID):
    # neither alive nor dead by /proc. An old-format owner of this very live process
    # is no proof of life either: an older bot in a container would have written the
    # same string for a PID of its own namespace.
    stat = read_stat(os.getpid())
    assert stat is not None
    for owner in (
        None,
        "",
        "nonsense",
        f"{HOST}:x:1",
        f"{HOST}:999999:1",
        f"{HOST}:{os.getpid()}:{stat.start_time}",
        f"{HOST}/boot=/pidns=x:1:1",
        f"{HOST}/pidns=1:{os.getpid()}:{stat.start_time}",
    ):
        assert judge_process(owner, HERE) is NOTHING, owner


def test_an_owner_of_another_boot_or_namespace_says_nothing() -> None:
    # Every machine's initial PID namespace has the same inode (4026531836, the kernel's
    # PROC_PID_INIT_INO; tests/samples/SOURCES.md, owner), and a container with host
    # networking has our hostname: only boot id AND namespace count.
    assert HERE.boot_id is not None and HERE.pid_ns is not None
    stat = read_stat(os.getpid())
    assert stat is not None
    other_boot = Namespace("0b0e1d5e-0000-4000-8000-000000000017", HERE.pid_ns)
    other_ns = Namespace(HERE.boot_id, HERE.pid_ns + 1)
    for where in (other_boot, other_ns, Namespace(None, HERE.pid_ns)):
        owner = str(Owner(HOST, os.getpid(), stat.start_time, where))
        assert judge_process(owner, HERE) is NOTHING, owner
    # A judge that cannot tell where it is judges nobody by its process, itself included.
    assert judge_process(process_owner(), NOWHERE) is NOTHING


def test_the_owner_string_and_what_an_older_bot_reads_in_it() -> None:
    owner = process_owner()
    parsed = parse_owner(owner)
    assert parsed is not None and parsed.where == HERE and parsed.host == HOST
    assert parsed.pid == os.getpid() and str(parsed) == owner
    assert owner.startswith(f"{HOST}/boot={HERE.boot_id}/pidns={HERE.pid_ns}:")
    old = parse_owner(f"{HOST}:4242:777")
    assert old == Owner(HOST, 4242, "777", None) and str(old) == f"{HOST}:4242:777"
    # An older bot splits `host:pid:start` from the right: it finds a host that is not
    # its hostname and a numeric PID, so it judges the new owner by the lease, never by
    # a /proc that may not show it (bot.engine.owner's docstring).
    head, pid, start = owner.rsplit(":", 2)
    assert head != HOST and int(pid) == os.getpid() and start == parsed.start_time


def test_a_proc_stat_with_spaces_and_parens_in_the_name(tmp_path: Path) -> None:
    # The command name (field 2) may hold spaces and ')': the fields after it still count.
    (tmp_path / "77").mkdir()
    rest = " ".join(["S", *map(str, range(4, 22)), "555", "0"])
    (tmp_path / "77" / "stat").write_text(f"77 (evil) name (x) {rest}\n")
    stat = read_stat(77, tmp_path)
    assert stat is not None and (stat.state, stat.start_time) == ("S", "555")
    owner = str(Owner(HOST, 77, "555", HERE))
    assert judge_process(owner, HERE, proc=tmp_path) is ALIVE
    (tmp_path / "77" / "stat").write_text(f"77 (evil) name (x) {rest.replace('S', 'Z', 1)}\n")
    assert judge_process(owner, HERE, proc=tmp_path) is DEAD


# ---- real PID namespaces ---------------------------------------------------------------


def _unshare() -> list[str]:
    tool = shutil.which("unshare")
    if tool is None or os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the PID-namespace tests need root and util-linux's unshare in CI")
        pytest.skip("needs root and unshare (util-linux) for a new PID namespace")
    return [tool, "--pid", "--fork", "--mount-proc", "--kill-child"]


def test_a_proc_of_another_pid_namespace_is_not_taken_for_ours() -> None:
    # `unshare --pid --fork` without --mount-proc leaves the parent's /proc: its PIDs are
    # not the child's, so the child must not judge anyone by it.
    unshare = [a for a in _unshare() if a != "--mount-proc"]
    probe = (
        "from bot.engine.owner import proc_is_ours, this_namespace; "
        "print(proc_is_ours(), this_namespace().known)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    shared = subprocess.run(
        [*unshare, sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        env=env,
    )
    assert shared.stdout.split() == ["False", "False"], shared.stderr
    own = subprocess.run(
        [*_unshare(), sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
        env=env,
    )
    assert own.stdout.split() == ["True", "True"], own.stderr
    assert proc_is_ours()


@asynccontextmanager
async def in_a_new_pid_namespace(role: str, db: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``tests.support.ns_process ROLE DB`` as PID 1 of a new PID namespace (and mount
    namespace, for its own /proc), with this test's hostname; killed at the end."""
    proc = await asyncio.create_subprocess_exec(
        *_unshare(),
        sys.executable,
        "-m",
        "tests.support.ns_process",
        role,
        str(db),
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()


async def ask(proc: asyncio.subprocess.Process, command: dict[str, Any]) -> Any:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(command).encode() + b"\n")
    await proc.stdin.drain()
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line, "the process in the namespace died"
    return json.loads(line)


async def ask_first_line(proc: asyncio.subprocess.Process) -> Any:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line, "the process in the namespace died before taking its run"
    return json.loads(line)


async def renewed(audit: AuditLog, run_id: int, past: int) -> None:
    async def moved() -> bool:
        return (await audit.get_run(run_id)).lease_renewals > past

    await eventually(moved, "the heartbeat to renew the lease", timeout_s=30)


async def test_a_run_owned_in_another_pid_namespace_lives_while_it_beats(tmp_path: Path) -> None:
    # The failure of garrytan/gbrain#2840 and ROCm/aiter#5269 (a PID judged from another
    # PID namespace under one hostname), here with our own run, service and clocks.
    db = tmp_path / "audit.db"
    s = ns_process.settings(db)
    plan = make_plan(s, Action.RESTART, ns_process.SERVICE)
    async with AuditLog.open(db) as audit, in_a_new_pid_namespace("owner", db) as inside:
        started = await ask_first_line(inside)
        run_id, owner = started["run"], parse_owner(started["owner"])
        # Our hostname and boot, another PID namespace; its PID 1 is not our PID 1.
        assert owner is not None and owner.where is not None
        assert (owner.host, owner.where.boot_id, owner.pid) == (HOST, HERE.boot_id, 1)
        assert owner.where.pid_ns != HERE.pid_ns
        ours = read_stat(1)
        assert ours is None or ours.start_time != owner.start_time

        clock = ManualClock()
        judge = RunLifecycle(s, audit, monotonic=Monotonic(clock, "judge-outside"))
        assert await judge.recover() == []  # a first look proves nothing
        with pytest.raises(
            LockHeldError,
            match=rf"the owner of run #{run_id} may be alive "
            r"\(last heartbeat change seen 0 s ago",
        ):
            await judge.request(plan, requested_by="cli:op", source=Source.CLI)
        clock.advance(LEASE_S - 1)
        assert await judge.recover() == []

        before = (await audit.get_run(run_id)).lease_renewals
        assert inside.stdin is not None
        inside.stdin.write(b"beat\n")  # its real heartbeat renews once
        await renewed(audit, run_id, before)
        clock.advance(1)  # a whole lease since the first look, but it changed meanwhile
        assert await judge.recover() == []
        clock.advance(LEASE_S - 1)
        assert await judge.recover() == []
        assert (await audit.get_run(run_id)).status == RunStatus.RUNNING

        os.killpg(inside.pid, signal.SIGKILL)  # its namespace's PID 1: all of it dies
        await inside.wait()
        clock.advance(1)  # nothing changed for a lease on the judge's clock
        [item] = await judge.recover()
        assert item.run.id == run_id and item.run.status == RunStatus.INTERRUPTED
        record = await judge.request(plan, requested_by="cli:op", source=Source.CLI)
        assert await audit.locks_held() == {record.id: ["host:gpu1", "service:svc"]}


async def test_a_judge_in_another_pid_namespace_leaves_our_live_run_alone(tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    s = ns_process.settings(db)
    wall = ManualWallClock()  # what our heartbeat sleeps on
    async with AuditLog.open(db) as audit:
        life = RunLifecycle(s, audit, clock=wall, sleep=wall.sleep)
        record = await life.request(
            make_plan(s, Action.RESTART, ns_process.SERVICE),
            requested_by="cli:op",
            source=Source.CLI,
        )
        assert await life.confirm(record.id, "cli:op")
        assert await life.start(record.id) is not None
        try:
            async with in_a_new_pid_namespace("judge", db) as judge:
                # Inside, our PID is nobody's (or another process's): its /proc says
                # nothing of us, and neither may it.
                assert await ask(judge, {"recover": True}) == {"recovered": []}
                busy = await ask(judge, {"request": True})
                assert f"the owner of run #{record.id} may be alive" in busy["busy"]
                assert await ask(judge, {"advance": LEASE_S - 1}) == {"ok": True}
                assert await ask(judge, {"recover": True}) == {"recovered": []}

                before = (await audit.get_run(record.id)).lease_renewals
                await eventually(lambda: wall.sleepers, "the heartbeat to wait", 5)
                wall.advance(RENEW_EVERY_S)
                await renewed(audit, record.id, before)
                await ask(judge, {"advance": 1})
                assert await ask(judge, {"recover": True}) == {"recovered": []}

                await life.released(record.id)  # its heartbeat stops, as a killed one's
                await ask(judge, {"advance": LEASE_S})
                assert await ask(judge, {"recover": True}) == {"recovered": [record.id]}
        finally:
            await life.released(record.id)
        assert (await audit.get_run(record.id)).status == RunStatus.INTERRUPTED


# ---- hidepid ---------------------------------------------------------------------------


@contextmanager
def proc_with_hidepid() -> Iterator[Path]:
    """A /proc of our PID namespace mounted with ``hidepid=2`` (another user's processes
    are not listed), in a directory ``nobody`` can reach; unmounted after."""
    _unshare()  # root, or skip
    where = Path(tempfile.mkdtemp(prefix="hidepid-", dir="/tmp"))
    where.chmod(0o755)
    subprocess.run(["mount", "-t", "proc", "-o", "hidepid=2", "proc", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)
        where.rmdir()


def test_a_process_hidepid_hides_is_not_taken_for_dead() -> None:
    # EPERM from kill(pid, 0) means "exists" (mvanhorn/cli-printing-press#547; see
    # tests/samples/SOURCES.md, owner).
    # hidepid=2: this root process is invisible to `nobody` in the same namespace. The
    # judge must not read "no /proc entry" as "gone" (kill(pid, 0) says EPERM: it is
    # there); a PID that really is gone (ESRCH) is still dead.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone_owner = _owner_of(gone.pid)
    gone.wait()
    with proc_with_hidepid() as proc:
        probe = (
            "import sys; from pathlib import Path; "
            "from bot.engine.owner import judge_process, this_namespace; "
            "p = Path(sys.argv[1]); here = this_namespace(p); "
            "print(here.known, *(judge_process(o, here, proc=p) for o in sys.argv[2:]))"
        )
        seen = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                sys.executable,
                "-c",
                probe,
                str(proc),
                process_owner(),
                gone_owner,
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO_ROOT,
            env={
                "PATH": "/usr/bin:/bin",
                "PYTHONPATH": str(REPO_ROOT),
                "PYTHONDONTWRITEBYTECODE": "1",
            },
        )
    assert seen.stdout.split() == ["True", "nothing", "dead"], seen.stderr
    assert boot_id() is not None
