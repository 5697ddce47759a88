"""The host-maintenance steps themselves (issue 23), once every service on the host is
stopped and its GPUs drained: the reboot and the wait for the host to come back, the GPU
reset, and the deep GPU check that decides whether the host goes back to work.

The reboot's wait is bounded by ``reboot_timeout_s`` of the injected clock (``Tick``), and
the host must come back as the same machine: a boot id other than the one preflight read
(``/proc/sys/kernel/random/boot_id``, new at every boot) over a connection whose host key
known_hosts still holds. A key that changed is refused as another machine answering at
its address, and the run stops there: nothing is started on a host the bot cannot tell
is the one approved.

A reset is tried once per GPU and never retried: ``nvidia-smi -r`` refused (a process,
Fabric Manager or persistence mode holding the GPU) means the GPU needs a reboot, and
the run says so (NVIDIA/NVSentinel#1690 for the persistence case, which this avoids by
turning persistence mode off for the reset and back on after).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from bot.core import host_ops
from bot.core.dcgm import DCGM_TIMEOUT_S
from bot.core.deep_check import DeepReport, registering
from bot.core.deep_query import DEEP_QUERY_ARGV, DeepReading
from bot.core.deep_reads import DeepRead, deep_report, read_query
from bot.core.deep_reads import deep_reads as deep_reads_of
from bot.core.gpu_query import warned_only
from bot.core.gpu_snapshot import Gpu
from bot.core.health_types import Level
from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    Phase,
    Progress,
    SudoAnswer,
    ask_sudo,
    pause,
    read_deep_state,
    run,
)
from bot.core.phases.common import HostLost, lost, read_snapshot, reason_of
from bot.core.phases.gpu_check import read_health
from bot.core.phases.preflight import Refused
from bot.core.plan import Step, cmd
from bot.core.results import CommandResult
from bot.errors import GpuQueryError
from bot.settings import MaintenanceSettings, ServiceSettings

# `cat` of the boot id, or `systemctl reboot` itself: each answers at once or not at all.
QUICK_TIMEOUT_S = 15.0
REBOOT_COMMAND_TIMEOUT_S = 60.0

Argv = tuple[str, ...]
RebootEnd = Literal["back", "not_rebooted", "timeout", "other_host"]


def sudo_allows(m: MaintenanceSettings, reboot: bool, gpus: Sequence[int], host: str) -> Phase[str]:
    """Asks sudo whether it would run each command this run will run as root (``sudo -n
    -l``, nothing run), before anything is stopped: a rule missing would otherwise be
    found at the reboot or reset, once every service was stopped (a 1T model reloaded
    for nothing). Raises ``Refused`` naming each command and the rules the host's
    drop-in lacks; returns what the preflight's summary says ("" where no sudo is used)."""
    commands = host_ops.root_commands(m, reboot, gpus)
    refused: list[tuple[Argv, SudoAnswer]] = []
    for argv in commands:
        a = yield from ask_sudo(Step.PREFLIGHT, argv, QUICK_TIMEOUT_S)
        if not a.asked:
            return ""  # the host runs them as they are (become = "none")
        if a.lost is not None:
            raise Refused(f"cannot ask sudo on {host} whether it would run `{cmd(argv)}`: {a.lost}")
        if a.refused is not None:
            refused.append((argv, a))
    if not refused:
        return f"sudo allows all {len(commands)} maintenance commands (sudo -n -l)"
    shown = ", ".join(f"`{cmd(argv)}`" for argv, _ in refused[:6])
    more = f" and {len(refused) - 6} more" if len(refused) > 6 else ""
    whys = "; ".join(dict.fromkeys(a.refused or "" for _, a in refused))
    rules = " ".join(dict.fromkeys(a.rule for _, a in refused if a.rule))
    raise Refused(
        f"sudo on {host} would not run {len(refused)} of the {len(commands)} commands this "
        f"run needs as root ({shown}{more}: {whys}), so nothing was stopped. {rules}"
    )


@dataclass(frozen=True, slots=True)
class Rebooted:
    end: RebootEnd
    why: str
    boot_id: str | None = None  # the new boot's, once back


def reboot_and_wait(m: MaintenanceSettings, boot_id: str) -> Phase[Rebooted]:
    """``systemctl reboot``, then the boot id read every ``reboot_poll_s`` until it is a
    new one. The reboot's own result may never come back (the host goes down under the
    session): only an exit status other than 0 says it did not reboot."""
    argv = host_ops.reboot_argv(m)
    yield Emit(BeginStep(Step.REBOOT, cmd(argv)))
    r = yield from run(Step.REBOOT, argv, REBOOT_COMMAND_TIMEOUT_S)
    if r.refused is not None or (r.exit_status not in (0, None) and not r.timed_out):
        said = " ".join(r.output.split())[:200]
        why = r.refused or f"`{cmd(argv)}` failed ({reason_of(r)}{': ' + said if said else ''})"
        yield Emit(EndStep(Step.REBOOT, False, why, r.exit_status, r.output))
        return Rebooted("not_rebooted", why)
    start = (yield from pause()).now
    seen_down = lost(r)
    while True:
        tick = yield from pause(m.reboot_poll_s)
        waited = tick.now - start
        if waited > m.reboot_timeout_s:
            why = f"no new boot within {m.reboot_timeout_s:g}s" + (
                " (the host stopped answering, then never answered again)" if seen_down else ""
            )
            yield Emit(EndStep(Step.REBOOT, False, why))
            return Rebooted("timeout", why)
        q = yield from run(Step.REBOOT, host_ops.BOOT_ID_ARGV, QUICK_TIMEOUT_S, quiet=True)
        if q.host_key_refused:
            why = (
                "the host came back with a host key known_hosts does not hold for it: "
                "refused as a different machine; nothing was started"
            )
            yield Emit(EndStep(Step.REBOOT, False, why, None, q.stderr))
            return Rebooted("other_host", why)
        if lost(q) or not q.ok:
            seen_down = True
            continue  # down, or still booting: sshd not yet there
        new = host_ops.parse_boot_id(q.stdout)
        if new is None or new == boot_id:
            continue  # not gone down yet (shutting the units down takes a while)
        said = f"back after {waited:.1f}s; boot id {boot_id[:8]} → {new[:8]}, same host key"
        yield Emit(EndStep(Step.REBOOT, True, said))
        return Rebooted("back", said, new)


@dataclass(frozen=True, slots=True)
class ResetReport:
    done: tuple[int, ...] = ()
    refused: dict[int, str] = field(default_factory=dict)
    # Where persistence mode could not be turned back on: a warning, the reset stands.
    left_off: tuple[int, ...] = ()
    # The GPUs whose refusal was sudo's: its `-pm 0` or `-r` never ran (a rule missing).
    by_sudo: tuple[int, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refused

    @property
    def not_run(self) -> bool:
        """Sudo refused every reset asked for and none was done: nothing was done to a
        GPU, and the cause is a sudoers rule, not the GPU (no reboot adds a rule)."""
        return bool(self.refused) and not self.done and set(self.refused) <= set(self.by_sudo)

    def text(self) -> str:
        parts = []
        if self.done:
            parts.append(f"reset GPU {', '.join(map(str, self.done))}")
        parts += [f"GPU {i} not reset: {why}" for i, why in self.refused.items()]
        if self.left_off:
            parts.append(
                f"persistence mode could not be turned back on for GPU "
                f"{', '.join(map(str, self.left_off))} (nvidia-smi -pm 1 as root)"
            )
        return "; ".join(parts) or "no GPU to reset"


def reset_gpus(
    m: MaintenanceSettings, svc: ServiceSettings, gpus: tuple[int, ...]
) -> Phase[ResetReport]:
    """Each GPU of ``gpus`` (all listed when empty): persistence mode off where it is on,
    ``nvidia-smi -r -i N`` once, persistence mode back on where it was."""
    yield Emit(BeginStep(Step.GPU_RESET, cmd(host_ops.PERSISTENCE_QUERY_ARGV)))
    q = yield from run(Step.GPU_RESET, host_ops.PERSISTENCE_QUERY_ARGV, svc.command_timeout_s)
    try:
        if not (q.ok or warned_only(q)):  # exit 14 with the infoROM warning: rows good
            raise ValueError(reason_of(q))
        rows = {g.index: g for g in host_ops.parse_persistence(q.stdout)}
    except ValueError as e:
        why = f"cannot read the GPUs' persistence mode ({e}); nothing was reset"
        yield Emit(EndStep(Step.GPU_RESET, False, why, q.exit_status, q.output))
        return ResetReport(refused={i: why for i in gpus} or {-1: why})
    targets = gpus or tuple(sorted(rows))
    done: list[int] = []
    refused: dict[int, str] = {}
    left_off: list[int] = []
    by_sudo: list[int] = []
    for i in targets:
        if i not in rows:
            refused[i] = f"GPU {i} is not listed by nvidia-smi"
            continue
        was_on = rows[i].enabled
        if was_on:
            off = yield from run(
                Step.GPU_RESET, host_ops.persistence_argv(m, i, False), svc.command_timeout_s
            )
            if not off.ok:
                refused[i] = off.refused or f"persistence mode stayed on ({reason_of(off)})"
                by_sudo += [i] if off.refused else []
                continue
        r = yield from run(Step.GPU_RESET, host_ops.reset_argv(m, i), m.reset_timeout_s)
        verdict = host_ops.reset_verdict(r)
        if verdict.ok:
            done.append(i)
        else:
            refused[i] = r.refused or verdict.why
            by_sudo += [i] if r.refused else []
        if was_on:
            on = yield from run(
                Step.GPU_RESET, host_ops.persistence_argv(m, i, True), svc.command_timeout_s
            )
            if not on.ok:
                left_off.append(i)
    report = ResetReport(tuple(done), refused, tuple(left_off), tuple(by_sudo))
    yield Emit(EndStep(Step.GPU_RESET, report.ok, report.text()))
    return report


def _drive_deep(svc: ServiceSettings, host: str, local: bool) -> Phase[DeepRead]:
    """The deep reads: NVML's readings where the bot runs on the host (and nvidia-smi where
    NVML fails, the report saying why), else the nvidia-smi commands."""
    if local:
        st = yield from read_deep_state()
        reads = deep_reads_of(host, st.readings, driver=st.driver, nvml_error=st.nvml_error)
    else:
        reads = deep_reads_of(host)
    result: CommandResult | None = None
    try:
        while True:
            argv = reads.send(result)  # type: ignore[arg-type]  # None only to start it
            timeout = max(svc.command_timeout_s, DCGM_TIMEOUT_S)
            result = yield from run(Step.DEEP_CHECK, argv, timeout, quiet=True)
    except StopIteration as stop:
        read: DeepRead = stop.value
        return read


def deep_check(
    m: MaintenanceSettings,
    svc: ServiceSettings,
    host: str,
    count_before: int | None,
    local: bool = False,
) -> Phase[DeepReport]:
    """The deep GPU check as a step: the GPU query and health check, then ``nvidia-smi -q
    -x`` and ``dcgmi diag -r 1``, judged with the GPU count the host had before. Where a
    GPU's NVSwitch fabric is still registering, it waits for it (``_wait_fabric``) and
    reads again; a GPU still registering then fails."""
    yield Emit(BeginStep(Step.DEEP_CHECK, "nvidia-smi -q -x; dcgmi diag -r 1; the GPU health"))
    listed: tuple[Gpu, ...] = ()
    health_error: str | None = None
    try:
        snap = yield from read_snapshot(Step.DEEP_CHECK, svc, host)
        listed = snap.gpus
    except (HostLost, GpuQueryError) as e:
        health_error = e.reason
    health, _ = yield from read_health(Step.DEEP_CHECK, svc, host, listed)
    read = yield from _drive_deep(svc, host, local)
    waited = 0.0
    if registering(read.readings):
        waited, settled = yield from _wait_fabric(m, svc, host, local)
        if settled:
            read = yield from _drive_deep(svc, host, local)  # the links come up with it
    labels = {g.uuid: f"GPU {g.index}" for g in listed}
    report = deep_report(host, read, health, health_error, count_before, labels, waited)
    failed = [f.line() for f in report.findings if f.level == Level.CRITICAL]
    summary = "ok" if not failed else f"FAIL: {'; '.join(failed)}"
    yield Emit(EndStep(Step.DEEP_CHECK, not failed, summary[:600], None, report.text()))
    return report


def _wait_fabric(
    m: MaintenanceSettings, svc: ServiceSettings, host: str, local: bool
) -> Phase[tuple[float, bool]]:
    """The GPUs' fabric state read again every ``reboot_poll_s`` of the flow's clock while a
    GPU is still registering, for at most ``fabric_wait_s``: (seconds waited, whether none
    is registering now). A read that fails is no answer: the wait goes on."""
    start = now = (yield from pause()).now
    while now - start < m.fabric_wait_s:
        now = (yield from pause(m.reboot_poll_s)).now
        readings = yield from _fabric_now(svc, host, local)
        if readings and not registering(readings):
            return now - start, True
        yield Progress(
            Step.DEEP_CHECK,
            "waiting for Fabric Manager to register the GPUs with the NVSwitch fabric "
            f"({now - start:.0f}s of {m.fabric_wait_s:g}s)",
            now - start,
        )
    return now - start, False


def _fabric_now(svc: ServiceSettings, host: str, local: bool) -> Phase[tuple[DeepReading, ...]]:
    """Each GPU as NVML (the bot's own host) or ``nvidia-smi -q -x`` reads it now; none
    where neither answers."""
    if local:
        st = yield from read_deep_state()
        if st.readings is not None:
            return st.readings
    q = yield from run(Step.DEEP_CHECK, DEEP_QUERY_ARGV, svc.command_timeout_s, quiet=True)
    return read_query(host, q).readings
