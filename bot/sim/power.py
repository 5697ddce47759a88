"""The simulated host's reboot (issue 23): ``systemctl reboot`` and the boot after it.

A reboot stores when it began (``HostState.rebooted_at``) and a new boot id. Until
``booted_at`` (``reboot_delay_s`` later; ``reboot_slow_s`` with the reboot_slow fault;
never with reboot_hangs) the host is down: every SSH login is dropped before its command
runs (the sshd wrapper and the embedded server ask ``settle``). Nothing runs in the
background: the first look after ``booted_at`` (a login, a tool, the kit) brings the host
up, and its enabled unit starts then, timed from ``booted_at`` as at boot.

What a reboot clears, as a real one does: every process of the unit (its fake server
ends, its GPU memory is freed), the requests in flight, the GPU state a reset or reboot
clears (a pending row remap, a required reset, a GPU fallen off the bus), persistence
mode (back to ``persistence_at_boot``) and the kernel log of this boot (the old one is
kept as ``kernel.boot-<n>.jsonl``). Uncorrectable ECC counts stay: the sim keeps one
count for volatile and aggregate.

A reboot run through the real sshd drops every connection of this host at once (its
sshd session processes are killed: the client never gets the exit status); through the
embedded server, a connection of an earlier boot is dropped at its next command or when
the reboot's own command ends (``bot.sim.server``).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from dataclasses import replace
from pathlib import Path

from bot.sim import kernel, procfs, vllm_server
from bot.sim.state import Run, StateStore, booted_at, is_down
from bot.sim.tools import unit

MARKER = "rebooting"  # in the state directory from a reboot until the host is up again
BOOT_ID_FILE = "boot_id"  # the boot id, for readers that must not parse the state
GATE_TOOL = "sim-boot-gate"  # what the sshd wrapper runs while MARKER exists
SSHD_CONFIG = Path("sshd") / "sshd_config"  # under the kit's root (bot.sim.sshd)


def write_boot_id(store: StateStore, boot_id: str) -> None:
    tmp = store.directory / f"{BOOT_ID_FILE}.tmp"
    tmp.write_text(boot_id + "\n", encoding="utf-8")
    os.replace(tmp, store.directory / BOOT_ID_FILE)


def read_boot_id(directory: Path) -> str:
    """The boot id file's text ("" before the kit wrote one)."""
    try:
        return (directory / BOOT_ID_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return ""


def reboot(store: StateStore) -> None:
    """``systemctl reboot``: everything stops now; up again at ``booted_at``."""
    now = time.time()
    with store.transaction() as tx:
        st = tx.state
        cfg = st.config
        svc = unit.service_name(cfg.unit)
        tx.journal_drop_after(now)  # a start in progress will never log the rest
        tx.journal_add(
            [
                unit.systemd_line(now, f"Stopping {svc} - {cfg.description}..."),
                unit.systemd_line(now, f"Stopped {svc} - {cfg.description}."),
                unit.systemd_line(now, "Reached target reboot.target - System Reboot."),
            ]
        )
        faults = replace(
            st.faults, pending_remap=False, reset_required=False, xid_79=False, busy=False
        )
        tx.state = replace(
            st,
            run=Run(generation=st.run.generation),  # no process of any run is left
            faults=faults,
            busy_since=None,
            dead=(),
            persistence=None,
            boot_id=str(uuid.uuid4()),
            reboots=st.reboots + 1,
            rebooted_at=now,
            boot_pending=True,
        )
        write_boot_id(store, tx.state.boot_id)
        (store.directory / MARKER).touch()
        _new_kernel_log(store, tx.state.reboots)
    vllm_server.stop_all(store.directory)


def _new_kernel_log(store: StateStore, boot: int) -> None:
    log = store.directory / kernel.FILE
    if log.exists():
        os.replace(log, store.directory / f"kernel.boot-{boot - 1}.jsonl")


def settle(store: StateStore) -> bool:
    """Bring a rebooted host up once its boot is over; True when it is up."""
    marker = store.directory / MARKER
    if not marker.exists():
        return True
    generation = None
    with store.transaction() as tx:
        st = tx.state
        if st.boot_pending:
            if is_down(st, time.time()):
                return False
            up = booted_at(st) or time.time()
            st = replace(st, boot_pending=False)
            if st.unit_enabled:
                st, plan = unit.start_at_boot(st, up)
                tx.journal_add(plan)
                generation = st.run.generation
            tx.state = st
        marker.unlink(missing_ok=True)
    if generation is not None:
        vllm_server.spawn(store.directory, generation)
    return True


def _stat(pid: int) -> tuple[int, str] | None:
    """(ppid, comm) of a live process."""
    try:
        raw = (procfs.PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[1]), raw[raw.index("(") + 1 : raw.rindex(")")]


def _is_sshd(pid: int) -> bool:
    info = _stat(pid)
    return info is not None and info[1].startswith("sshd")  # sshd, sshd-session (9.8+)


def drop_connections(store: StateStore, *, everyone: bool) -> bool:
    """Kill the sshd session processes above this tool (``everyone``: every connection
    of this host's sshd), so that the client loses the connection without an exit
    status. Only this host's own sshd is touched: the listener started with this kit's
    config (a system sshd further up, the one a developer logged in through, never).
    False when this tool is not run under that sshd (the embedded server, a test)."""
    config = str(store.directory.parent / SSHD_CONFIG)
    pid = procfs.standing_for() or os.getpid()
    chain: list[int] = []
    while pid > 1 and (info := _stat(pid)) is not None:
        if info[1].startswith("sshd"):
            if any(config in a for a in procfs.cmdline(pid)):  # the listener
                victims = procfs.descendants(pid) if everyone else chain
                for p in victims:
                    if _is_sshd(p):
                        try:
                            os.kill(p, signal.SIGKILL)
                        except (ProcessLookupError, PermissionError):
                            pass  # a root monitor exits by itself when its child dies
                return True
            chain.append(pid)
        pid = info[0]
    return False


EMBEDDED_ENV = "SIM_EMBEDDED_SSH"  # set in the commands the embedded server runs


def end_embedded_session(owner_pid: int) -> bool:
    """Under the embedded server: kill the caller's session (its shell and whatever it
    would run after this tool), as the host going down does; the server then drops the
    connection instead of sending an exit status. Never the kit's own session."""
    if os.environ.get(EMBEDDED_ENV) != "1":
        return False
    try:
        sid = os.getsid(procfs.standing_for() or os.getpid())
        if sid == os.getsid(owner_pid):
            return False
    except OSError:
        return False
    procfs.signal_all([p for p in procfs.session_members(sid) if p != os.getpid()], signal.SIGKILL)
    return True


def gate_main(store: StateStore) -> int:
    """The sshd wrapper's check while a reboot is in progress: exit 0 to run the
    command; otherwise the connection is dropped (and 255, should it survive)."""
    if settle(store):
        return 0
    drop_connections(store, everyone=False)
    return 255
