"""bot.core.leftovers: whose processes hold a service's GPUs, and the fixed signal command.

``ps`` and the signal script run for real here (procps-ng on this machine), on
processes the test starts: the parser reads what the real ``ps`` prints, and the
script really signals (or skips) a real PID.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.core.gpu import DrainVerdict, Holder
from bot.core.leftovers import (
    Owner,
    ProcFacts,
    candidates,
    classify,
    facts_query,
    judge_owner,
    parse_facts,
    parse_signalled,
    prompt,
    signal_command,
)

UNIT = "vllm-kimi-k25"
OURS = "0::/system.slice/vllm-kimi-k25.service"
STARTED = "Mon Nov 30 21:25:07 2026"


def facts(pid: int = 48304, state: str = "Sl", user: str = "vllm", cgroup: str = OURS) -> ProcFacts:
    return ProcFacts(pid, state, user, STARTED, cgroup)


# --------------------------------------------------------------------------- real ps


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    if shutil.which("ps") is None:
        pytest.skip("ps (procps) is not installed")
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def run(argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def test_parse_facts_reads_what_the_real_ps_prints(sleeper: subprocess.Popen[bytes]) -> None:
    r = run(facts_query([sleeper.pid, os.getpid()]))
    assert r.returncode == 0, r.stderr
    got = parse_facts(r.stdout)
    assert set(got) == {sleeper.pid, os.getpid()}
    mine = got[sleeper.pid]
    assert mine.state[0] in "SR" and mine.user and len(mine.started.split()) == 5
    # The start time is what `ps -o lstart` prints in the C locale, spaces collapsed.
    lstart = run(("env", "LC_ALL=C", "ps", "-o", "lstart=", "-p", str(sleeper.pid))).stdout
    assert mine.started == " ".join(lstart.split())


def test_ps_of_pids_that_do_not_exist_exits_1_with_nothing() -> None:
    r = run(facts_query([2_000_000_000]))
    assert (r.returncode, parse_facts(r.stdout)) == (1, {})


@pytest.fixture
def worker() -> Iterator[subprocess.Popen[bytes]]:
    """A real process that looks like a vLLM worker: ``VLLM::Worker_TP0`` in ``ps``."""
    sleep = shutil.which("sleep")
    if shutil.which("ps") is None or sleep is None:
        pytest.skip("ps (procps) is not installed")
    proc = subprocess.Popen(["VLLM::Worker_TP0", "60"], executable=sleep, start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def systemctl_saying(tmp_path: Path, user: str) -> str:
    """A systemctl whose ``show -p User --value`` answers ``user`` (no systemd here)."""
    path = tmp_path / "systemctl"
    path.write_text(f"#!/bin/sh\necho {shlex.quote(user)}\n")
    path.chmod(0o755)
    return str(path)


def unit_holding(f: ProcFacts) -> str:
    """The unit whose cgroup holds the test's processes (under systemd), else one that
    does not exist: the script then judges by user and name, as for a worker in no unit."""
    return f.units()[-1] if f.units() else "vllm-kimi-k25"


def test_the_signal_script_signals_a_pid_only_with_its_start_time(
    worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    me = parse_facts(run(facts_query([worker.pid])).stdout)[worker.pid]
    systemctl = systemctl_saying(tmp_path, me.user)
    other_start = ProcFacts(me.pid, me.state, me.user, "Thu Jan 1 00:00:00 1970", me.cgroup)
    # A start time that is not the process's own: a reused PID, never signalled.
    r = run(signal_command("TERM", [other_start], unit_holding(me), systemctl))
    assert parse_signalled(r.stdout) == {worker.pid: "reused"}
    assert worker.poll() is None
    r = run(signal_command("TERM", [me, facts(pid=2_000_000_000)], unit_holding(me), systemctl))
    assert parse_signalled(r.stdout) == {worker.pid: "sent", 2_000_000_000: "gone"}, r.stderr
    assert worker.wait(timeout=10) == -signal.SIGTERM


def test_the_signal_script_finds_no_tool_through_the_callers_path(
    worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    # Issue 17, F1: the script runs as root, and where sudo keeps the caller's PATH
    # (`Defaults !secure_path`) a `ps` or `kill` the login put first would run as root.
    # Here the caller's PATH starts with such tools; the script runs the real ones only.
    me = parse_facts(run(facts_query([worker.pid])).stdout)[worker.pid]
    own, marker = tmp_path / "own", tmp_path / "ran"
    own.mkdir()
    for name in ("ps", "kill", "env", "echo", "cat", "sh"):
        (own / name).write_text(
            f'#!/bin/sh\necho {name} >> {shlex.quote(str(marker))}\nexec /usr/bin/{name} "$@"\n'
        )
        (own / name).chmod(0o755)
    argv = signal_command("TERM", [me], unit_holding(me), systemctl_saying(tmp_path, me.user))
    r = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=False,
        env={"PATH": f"{own}:/usr/bin:/bin", "LC_ALL": "C"},
    )
    assert parse_signalled(r.stdout) == {worker.pid: "sent"}, r.stderr
    assert worker.wait(timeout=10) == -signal.SIGTERM
    assert not marker.exists(), marker.read_text()


def test_the_signal_script_refuses_a_process_that_is_not_the_units(
    sleeper: subprocess.Popen[bytes], worker: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    # Under sudo the PIDs are the rule's wildcard: whoever holds the bot's key can name
    # any process. The script judges again on the host, so only the unit's can be hit.
    facts_now = parse_facts(run(facts_query([sleeper.pid, worker.pid])).stdout)
    plain, vllm = facts_now[sleeper.pid], facts_now[worker.pid]
    elsewhere = "vllm-elsewhere"  # no process of this test is in its cgroup
    # Not named VLLM:: (sshd, a shell, another team's job), though of the unit's user:
    r = run(signal_command("KILL", [plain], elsewhere, systemctl_saying(tmp_path, plain.user)))
    assert parse_signalled(r.stdout) == {sleeper.pid: "refused"}
    # A VLLM:: process of another user than the unit's (another team's vLLM):
    r = run(signal_command("KILL", [vllm], elsewhere, systemctl_saying(tmp_path, "nobody")))
    assert parse_signalled(r.stdout) == {worker.pid: "refused"}
    # A unit that runs as root (User= empty) owns no VLLM:: process outside its cgroup:
    r = run(signal_command("KILL", [vllm], elsewhere, systemctl_saying(tmp_path, "")))
    assert parse_signalled(r.stdout) == {worker.pid: "refused"}
    # What the bot never sends but a caller of the sudo rule could: PID 1, text, a signal
    # other than TERM or KILL.
    systemctl = systemctl_saying(tmp_path, vllm.user)
    script = signal_command("KILL", [vllm], elsewhere, systemctl)
    r = run((*script[:9], "1:x", "-1:x", "$(id):x", "01:x", "0:x", "*:x"))
    assert r.stdout.splitlines() == [
        "1 refused",
        "-1 refused",
        "$(id) refused",
        "01 refused",
        "0 refused",
        "* refused",
    ]
    r = run((*script[:8], "HUP", f"{worker.pid}:{vllm.started}"))
    assert r.returncode == 2 and r.stdout == ""
    assert sleeper.poll() is None and worker.poll() is None


@pytest.mark.parametrize(
    "bad",
    [
        lambda: signal_command("HUP", [facts()], UNIT),  # type: ignore[arg-type]
        lambda: signal_command("TERM", [facts(pid=1)], UNIT),
        lambda: signal_command("TERM", [ProcFacts(48304, "S", "vllm", "$(reboot)", OURS)], UNIT),
        lambda: facts_query([0]),
    ],
)
def test_nothing_but_validated_pids_and_start_times_reach_the_script(bad: object) -> None:
    with pytest.raises(ValueError):
        bad()  # type: ignore[operator]


def test_the_script_is_fixed_and_the_targets_are_arguments() -> None:
    argv = signal_command(
        "KILL",
        [facts(), facts(pid=48305)],
        UNIT,
        "/usr/bin/systemctl",
        ps="/bin/ps",
        kill="/bin/kill",
    )
    assert argv[:3] == ("/bin/sh", "-c", signal_command("TERM", [facts()], "other")[2])
    # What the sudoers rule fixes (the tools' paths, the unit, the signal), then the targets.
    assert argv[3:] == (
        "sh",
        "/usr/bin/systemctl",
        "/bin/ps",
        "/bin/kill",
        f"{UNIT}.service",
        "KILL",
        f"48304:{STARTED}",
        f"48305:{STARTED}",
    )


# --------------------------------------------------------------------------- whose


@pytest.mark.parametrize(
    ("f", "name", "owner", "why"),
    [
        (facts(), "VLLM::Worker_TP3", Owner.SERVICE, "in vllm-kimi-k25.service's cgroup"),
        (
            facts(
                cgroup="12:pids:/system.slice/vllm-kimi-k25.service,1:name=systemd:/system.slice/"
                "vllm-kimi-k25.service"
            ),
            "python3",
            Owner.SERVICE,
            "cgroup",
        ),
        (
            facts(cgroup="0::/system.slice/vllm-other.service"),
            "VLLM::Worker_TP0",
            Owner.OTHER,
            "in vllm-other.service's cgroup",
        ),
        (
            facts(cgroup="0::/user.slice/user-1000.slice/session-3.scope"),
            "VLLM::EngineCore",
            Owner.SERVICE,
            "a VLLM:: process of vllm",
        ),
        (
            facts(user="alice", cgroup="0::/user.slice/user-1000.slice/session-3.scope"),
            "VLLM::EngineCore",
            Owner.OTHER,
            "user alice",
        ),
        (
            facts(cgroup="0::/user.slice/user-1000.slice/session-3.scope"),
            "python3",
            Owner.OTHER,
            "user vllm",
        ),
        (facts(state="Z"), "VLLM::Worker_TP3", Owner.GONE, "zombie"),
        (None, "VLLM::Worker_TP3", Owner.GONE, "exited"),
    ],
)
def test_whose_a_process_is(f: ProcFacts | None, name: str, owner: Owner, why: str) -> None:
    got, said = judge_owner(f, name, UNIT, "vllm")
    assert got == owner and why in said


def test_candidates_and_the_prompt_come_from_the_drain_verdict() -> None:
    verdict = DrainVerdict(
        False,
        1024,
        (
            Holder("process", 3, "GPU-3", 48304, "VLLM::Worker_TP3", 95986),
            Holder("worker", pid=48253, name="VLLM::EngineCore"),
            Holder("process", 5, "GPU-5", 30089, "VLLM::Worker_TP0", 89986),
        ),
    )
    found = candidates(verdict)
    assert [p for p, *_ in found.processes] == [48304, 48253, 30089]
    assert not found.memory_only and not found.missing
    known = {
        48304: facts(),
        48253: facts(pid=48253),
        30089: facts(pid=30089, cgroup="0::/system.slice/vllm-other.service"),
    }
    left = classify(found, known, UNIT, "vllm")
    assert [x.owner for x in left] == [Owner.SERVICE, Owner.SERVICE, Owner.OTHER]
    text = prompt("gpu-node-1", UNIT, left)
    assert "2 processes of vllm-kimi-k25.service" in text
    assert "PID 48304 (VLLM::Worker_TP3): GPU 3, 95,986 MiB" in text
    assert "PID 48253 (VLLM::EngineCore): no GPU listed, memory n/a" in text
    assert "30089" not in text


def test_memory_held_by_no_process_is_told_apart() -> None:
    verdict = DrainVerdict(False, 1024, (Holder("memory", 3, "GPU-3", used_mib=96000),))
    found = candidates(verdict)
    assert found.processes == () and len(found.memory_only) == 1
