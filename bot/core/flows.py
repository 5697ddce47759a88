"""The maintenance sequences as pure generators: they yield actions and consume outcomes.

No I/O happens here (the httpx ``auth_flow`` pattern): ``bot.engine.executor`` performs
each action and sends the outcome back, and the tests drive these generators
with hand-made outcomes to cover every branch.  A flow handles one host and
returns a ``HostOutcome``; rollouts over several hosts are composed by the caller.

Outcomes sent back per action:
``RunCommand`` -> ``CommandResult``; ``HttpCheck`` -> ``HttpResult``;
``ReadGpuState`` -> ``GpuStateRead``;
``Sleep`` / ``Checkpoint`` -> ``Tick``; ``Emit`` / ``Progress`` -> ``None``.

A ``CommandResult`` with neither an exit status nor a signal means the result
never came back: the host could not be reached, the connection died (keepalive
lost, link cut) or stopped answering past the local deadline.  What the command
did on the host is then unknown (``lost``), and each step decides what that
means for it; see docs/reliability.md for the whole fault matrix.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.core import remote
from bot.core.cuda import gate_verdict, parse_driver_cuda, parse_gate_output
from bot.core.gpu import (
    DrainVerdict,
    DriverWarning,
    Gpu,
    GpuSnapshot,
    build_snapshot,
    check_nvidia_smi,
    drain_verdict,
    memory_summary,
    parse_pgrep,
    scoped,
    select_gpus,
)
from bot.core.health import (
    HEALTH_QUERY_ARGV,
    GpuCheck,
    GpuStateRead,
    HostHealth,
    Level,
    details,
    health_reads,
    judge,
    new_xids,
)
from bot.core.leftovers import (
    Approval,
    AskApproval,
    Leftover,
    Owner,
    ProcFacts,
    candidates,
    classify,
    facts_query,
    memory_without_process,
    parse_facts,
    parse_signalled,
    prompt,
    service_name,
    shown_signal,
    signal_command,
    unit_user_query,
)
from bot.core.metrics import Load, MetricsError, parse_load
from bot.core.packages import (
    EnvKind,
    Freeze,
    PackageDiff,
    diff_freezes,
    downloaded_bytes,
    parse_freeze,
    parse_install_changes,
    parse_install_set,
    planned_diff,
)
from bot.core.plan import (
    Plan,
    Step,
    cmd,
    gpu_check_command,
    gpu_recheck_command,
    readiness_command,
    requests_command,
)
from bot.core.privilege import Privilege, run_as_of
from bot.core.readiness import (
    api_base,
    completion_body,
    completion_text,
    error_message,
    metrics_url,
    model_ids,
    reported_version,
)
from bot.core.results import CommandResult, HttpResult
from bot.core.startup import (
    StartupWatch,
    describe_failure,
    failure_block,
    new_lines,
    thread_block,
)
from bot.core.status import Action as RunAction  # `Action` here is what a flow yields
from bot.core.status import HostStatus
from bot.core.versions import same_release
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings

# ---- actions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunCommand:
    step: Step
    argv: tuple[str, ...]
    timeout_s: float
    # Polls are not streamed line by line; the step's summary reports their result.
    quiet: bool = False
    # What the command reads on stdin: an index URL, which may hold credentials, so it
    # stays out of reprs and logs (see bot.core.remote.INDEX_FROM_STDIN).
    stdin: bytes | None = field(default=None, repr=False)
    # The account it needs, as its builder in bot.core.remote said; the executor turns
    # it into a sudo prefix on hosts with `become = "sudo"` (bot.core.sudoers.become).
    run_as: Privilege = Privilege.NONE


@dataclass(frozen=True, slots=True)
class ReadGpuState:
    """Read the GPUs' state (ECC, pending pages and row remaps, recovery action): through
    NVML where the bot runs on the host, else by running ``fallback`` (``nvidia-smi -q``),
    also where NVML fails. NVML has no Xid history: the kernel log stays a command."""

    fallback: RunCommand


@dataclass(frozen=True, slots=True)
class HttpCheck:
    url: str
    timeout_s: float
    method: str = "GET"
    body: bytes | None = field(default=None, repr=False)
    content_type: str | None = None


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A safe point at which a cancel request may take effect."""


@dataclass(frozen=True, slots=True)
class Tick:
    now: float  # monotonic seconds
    cancel_requested: bool = False


# ---- things the flow tells the world (the executor adds run id, host, timing) -----------


@dataclass(frozen=True, slots=True)
class BeginStep:
    step: Step
    command: str


@dataclass(frozen=True, slots=True)
class EndStep:
    step: Step
    ok: bool
    summary: str
    exit_status: int | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Snapshot:
    label: str
    snapshot: GpuSnapshot


@dataclass(frozen=True, slots=True)
class Versions:
    before: str | None
    after: str | None


@dataclass(frozen=True, slots=True)
class Packages:
    """A package set the run learned (``EnvKind``): a change (``diff``), or the whole
    environment before anything changed (``freeze``, kept on the host at ``lock``)."""

    kind: EnvKind
    diff: PackageDiff | None = None
    freeze: str | None = None
    lock: str | None = None
    note: str = ""  # why a diff is missing, or what it was compared with


@dataclass(frozen=True, slots=True)
class Health:
    """The GPU check's verdict on a host, read at the request for the approval card."""

    check: GpuCheck


Notice = BeginStep | EndStep | Snapshot | Versions | Packages | Health


@dataclass(frozen=True, slots=True)
class Emit:
    notice: Notice


@dataclass(frozen=True, slots=True)
class Progress:
    """What a running step is doing now, shown in place on the status card (the
    executor adds the run, the host and, for a start-up wait, this service's usual
    start time). Not recorded: the step's end is."""

    step: Step
    text: str
    elapsed_s: float | None = None
    start_up: bool = False


Action = (RunCommand | HttpCheck | ReadGpuState | Sleep | Checkpoint | Emit | Progress
          | AskApproval)


@dataclass(frozen=True, slots=True)
class HostOutcome:
    status: HostStatus
    summary: str
    version_before: str | None = None
    version_after: str | None = None


Flow = Generator[Action, Any, HostOutcome]

HEALTH_REQUEST_TIMEOUT_S = 5.0
# After an install's timeout the host's `timeout` sends TERM, then KILL after
# bot.hosts.ssh.KILL_AFTER_S (10 s): past this margin no install we started can still run.
INSTALL_KILL_GRACE_S = 15.0

# ---- small helpers (sub-generators) ----------------------------------------------------


def lost(r: CommandResult) -> bool:
    """No exit status and no signal: the result never came back (see the module doc)."""
    return r.exit_status is None and r.signal is None


class _HostLost(GpuQueryError):
    """A poll's result never came back; a GpuQueryError so read-only callers treat it
    like any other failed query, while the drain can tell it apart and retry."""


def _why(r: CommandResult) -> str:
    if r.refused is not None:
        return r.refused  # sudo did not run it: the rule the host lacks
    if r.timed_out and r.exit_status is None and r.signal is None:
        return "no answer within the step's timeout: the host or the link is stuck"
    if r.timed_out:
        return "timed out"
    if r.exit_status is None:
        return f"ended by signal {r.signal}" if r.signal else (r.stderr.strip() or "no exit status")
    return f"exit {r.exit_status}"


def _failed(what: str, r: CommandResult, timeout_s: float) -> str:
    """Why a command failed; a timeout (the host's `timeout` ended it with TERM, then
    KILL) names the limit and the command's last line of output."""
    if not r.timed_out:
        return f"{what} failed ({_why(r)})"
    last = _tail(r.output, 1)
    return f"{what} timed out after {timeout_s:g}s" + (f" (last output: {last})" if last else "")


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _run(step: Step, argv: tuple[str, ...], timeout: float, *, quiet: bool = False,
         stdin: bytes | None = None) -> Generator[Action, Any, CommandResult]:
    result: CommandResult = yield RunCommand(step, argv, timeout, quiet, stdin, run_as_of(argv))
    return result


def _tick(seconds: float | None = None) -> Generator[Action, Any, Tick]:
    tick: Tick = yield (Checkpoint() if seconds is None else Sleep(seconds))
    return tick


def _snapshot(step: Step, svc: ServiceSettings, host: str
              ) -> Generator[Action, Any, GpuSnapshot]:
    """Query GPUs and compute apps; raises GpuQueryError when nvidia-smi fails
    (``_HostLost`` when its result never came back)."""
    gpus = yield from _run(step, remote.gpu_query(), svc.command_timeout_s, quiet=True)
    _check_reached(host, gpus)
    check_nvidia_smi(host, gpus)
    apps = yield from _run(step, remote.apps_query(), svc.command_timeout_s, quiet=True)
    _check_reached(host, apps)
    check_nvidia_smi(host, apps)
    return _in_scope(svc, build_snapshot(host, gpus.stdout, apps.stdout,
                                         (gpus.stderr, apps.stderr)))


def _check_reached(host: str, r: CommandResult) -> None:
    if lost(r):
        raise _HostLost(host, _why(r))


def _version(step: Step, svc: ServiceSettings) -> Generator[Action, Any, str | None]:
    version, _, _ = yield from _read_version(step, svc)
    return version


def _read_version(step: Step, svc: ServiceSettings
                  ) -> Generator[Action, Any, tuple[str | None, str, str]]:
    """(version, why it is unknown, the output that says so).  The query is quiet, so
    its output reaches no one unless the caller keeps it: uv's own words ("No virtual
    environment or system Python installation found for path ...") are the reason."""
    argv = remote.package_show(svc)
    r = yield from _run(step, argv, svc.command_timeout_s, quiet=True)
    version = remote.parse_package_version(r.stdout) if r.ok else None
    if version is not None:
        return version, "", ""
    return None, f"`{cmd(argv)}`: {_explain(r)}", _evidence(argv, r)


def _explain(r: CommandResult) -> str:
    """Why a command's result is unusable, in its own last words."""
    said = _tail(r.output, 3)
    if r.ok:
        return f"unexpected output: {said}" if said else "no output"
    return f"{_why(r)}: {said}" if said and not lost(r) else _why(r)


def _evidence(argv: tuple[str, ...], r: CommandResult) -> str:
    """The tail of a quiet command's output, for a failed step's output (which
    otherwise holds only what was streamed)."""
    return f"$ {cmd(argv)}\n{_tail(r.output) or '(' + _why(r) + ')'}"


def _unit_state(step: Step, svc: ServiceSettings
                ) -> Generator[Action, Any, tuple[CommandResult, dict[str, str]]]:
    r = yield from _run(step, remote.unit_show(svc), svc.command_timeout_s)
    return r, remote.parse_unit_show(r.stdout)


def _check_unit(svc: ServiceSettings, r: CommandResult, props: dict[str, str]) -> str | None:
    """A reason to refuse, or None when the unit exists."""
    if not r.ok:
        return f"cannot read the state of {svc.unit} ({_why(r)}): {_tail(r.output, 3)}"
    if props.get("LoadState") != "loaded":
        return (f"unit {svc.unit} is not loaded on this host "
                f"(LoadState={props.get('LoadState', '?')})")
    return None


# ---- steps ------------------------------------------------------------------------------


def _status_hint(service: str) -> str:
    return f"Check with `/vllm status {service}` (or `python -m bot status {service}`)"


def _stop(svc: ServiceSettings, service: str) -> Generator[Action, Any, str | None]:
    """systemctl stop. None when stopped, else the run's summary."""
    argv = remote.unit_stop(svc)
    yield Emit(BeginStep(Step.STOP, cmd(argv)))
    r = yield from _run(Step.STOP, argv, svc.stop_timeout_s)
    if lost(r):
        # systemd goes on with a stop job whose client went away, if it ever got it.
        msg = f"connection lost during systemctl stop ({_why(r)})"
        yield Emit(EndStep(Step.STOP, False, msg, None, _tail(r.output)))
        return (f"{msg}: the service may be running, stopping or stopped. "
                f"{_status_hint(service)}.")
    if not r.ok:
        msg = _failed("systemctl stop", r, svc.stop_timeout_s)
        yield Emit(EndStep(Step.STOP, False, msg, r.exit_status, _tail(r.output)))
        if r.refused is not None:
            return f"{msg}. The stop never ran: the service was not touched"
        return f"{msg}; the service may still be running"
    yield Emit(EndStep(Step.STOP, True, f"{svc.unit} stopped", r.exit_status))
    return None


def _drain_poll(svc: ServiceSettings, host: str
                ) -> Generator[Action, Any, tuple[GpuSnapshot, DrainVerdict]]:
    """One look at GPU memory, compute apps and surviving workers."""
    snap = yield from _snapshot(Step.DRAIN, svc, host)
    w = yield from _run(Step.DRAIN, remote.workers_query(), svc.command_timeout_s, quiet=True)
    _check_reached(host, w)
    # pgrep exits 1 when nothing matches; anything else means we could not tell.
    if w.exit_status not in (0, 1):
        raise GpuQueryError(host, f"cannot list vLLM workers ({_why(w)})",
                            exit_status=w.exit_status, output=w.output)
    workers = yield from _service_workers(svc, host, snap, parse_pgrep(w.stdout, host))
    return snap, drain_verdict(snap, svc.drain_threshold_mib, workers)


# How a drain or an install ended, for the flow to decide what comes next.
DrainEnd = Literal["ok", "failed", "cancelled"]
InstallEnd = Literal["ok", "failed", "unknown"]


def _drain(svc: ServiceSettings, host: str
           ) -> Generator[Action, Any, tuple[DrainEnd, str | None]]:
    """Poll until GPU memory is released. Returns how it ended and why.

    A poll whose result never came back is no verdict: the next poll reconnects,
    and only the drain timeout ends the wait."""
    yield Emit(BeginStep(Step.DRAIN, f"poll {cmd(remote.gpu_query())}, "
                         f"{cmd(remote.apps_query())}, {cmd(remote.workers_query())}"))
    start = (yield from _tick(0.0)).now
    polls = 0
    last: tuple[GpuSnapshot, DrainVerdict] | None = None  # the latest poll that was answered
    unreachable: str | None = None  # why the latest poll was not
    while True:
        polls += 1
        try:
            last = yield from _drain_poll(svc, host)
            unreachable = None
        except _HostLost as e:
            unreachable = e.reason
        except GpuQueryError as e:
            msg = f"cannot tell whether the GPUs are free: {e.reason}"
            yield Emit(EndStep(Step.DRAIN, False, msg, e.exit_status, _tail(e.output)))
            return "failed", msg
        tick = yield from _tick(0.0)
        elapsed = tick.now - start
        drained = unreachable is None and last is not None and last[1].drained
        # A cancel wins over a drain that just ended: once the drain says "ok" the
        # reinstall starts, and a cancel can then only take effect after it.
        if tick.cancel_requested:
            if last is not None:
                yield Emit(Snapshot("drain cancelled", last[0]))
            yield Emit(EndStep(Step.DRAIN, False, "cancelled once the GPU memory was released"
                               if drained else "cancelled while waiting for GPU memory"))
            return "cancelled", None
        if drained and last is not None:
            yield Emit(Snapshot("after drain", last[0]))
            yield Emit(EndStep(Step.DRAIN, True,
                               f"GPU memory released after {elapsed:.1f}s ({polls} polls)"))
            return "ok", None
        if elapsed >= svc.drain_timeout_s:
            if unreachable is not None or last is None:
                msg = (f"no answer from the host while waiting for GPU memory ({unreachable}); "
                       f"could not confirm within {svc.drain_timeout_s:g}s that it was released")
                yield Emit(EndStep(Step.DRAIN, False, msg))
                return "failed", msg
            yield Emit(Snapshot("drain timeout", last[0]))
            msg = (f"GPU memory still held after {svc.drain_timeout_s:g}s: "
                   f"{last[1].describe()}")
            yield Emit(EndStep(Step.DRAIN, False, msg, None, last[1].describe()))
            return "failed", msg
        yield Sleep(svc.drain_poll_s)


def _start_and_gate(svc: ServiceSettings, start_step: Step, health_step: Step
                    ) -> Generator[Action, Any, str | None]:
    """systemctl start, then wait for the unit to stay up and /health to answer 200
    (following the journal meanwhile), then the readiness checks. Returns None when
    ready, else the reason (journal tail in the failed step's detail)."""
    started, cursor = yield from _start_unit(svc, start_step)
    if started is not None:
        return started
    unhealthy = yield from _health_wait(svc, health_step, cursor)
    if unhealthy is not None:
        return unhealthy
    return (yield from _readiness(svc, READINESS_OF[health_step]))


def _left_as(svc: ServiceSettings, step: Step, err: str) -> Generator[Action, Any, str]:
    """What a failed start (``err``) left, as systemd says now. UP but NOT READY only for
    a unit that runs a server that may answer clients (failed /health or readiness:
    another model, a failing smoke test). DOWN when the unit does not run, when systemd
    is restarting it (``activating``: a Restart= wait), and when the start failed in the
    journal (an OOM, "Engine core initialization failed"): that process serves nothing
    and exits, however long systemd still shows it active."""
    r = yield from _run(step, remote.unit_is_active(svc), svc.command_timeout_s, quiet=True)
    state = r.stdout.strip()
    if lost(r) or not state:
        return f"Whether the service runs is unknown ({_why(r)})."
    if state in ("inactive", "failed", "deactivating"):
        return "The service is DOWN."
    if state == "activating":
        return ("The service is DOWN (unit activating: systemd is starting it again or "
                "still starting it).")
    if err.startswith(STARTUP_FAILED):
        return (f"The service is DOWN: its start failed (the unit is still {state} until "
                "its process exits; it may hold the GPUs until then).")
    if state in ("active", "reloading"):
        return f"The service is UP but NOT READY (unit {state})."
    return f"The service's unit is {state}."


def _start_unit(svc: ServiceSettings, start_step: Step
                ) -> Generator[Action, Any, tuple[str | None, str | None]]:
    """systemctl start. (None, the journal's cursor before the start) when started (or
    the connection was lost: systemd carries on, the health gate decides); else why not."""
    argv = remote.unit_start(svc)
    yield Emit(BeginStep(start_step, cmd(argv)))
    # Where the unit's journal is now: following the start reads only what comes after,
    # so an old run's traceback never ends this one's wait.
    c = yield from _run(start_step, remote.journal_cursor(svc), svc.command_timeout_s,
                        quiet=True)
    cursor = new_lines(c.stdout)[1] if c.ok else None
    r = yield from _run(start_step, argv, svc.command_timeout_s)
    if lost(r):
        # systemd carries on with a start job whose client went away; if the command
        # never arrived, the gate finds the unit inactive and says so.
        yield Emit(EndStep(start_step, True, f"connection lost while systemctl start ran "
                           f"({_why(r)}); the health gate decides"))
    elif not r.ok:
        msg = f"systemctl start failed ({_why(r)})"
        journal = yield from _journal(start_step, svc)
        yield Emit(EndStep(start_step, False, msg, r.exit_status,
                           _tail(r.output) + "\n" + journal))
        return msg, None
    else:
        yield Emit(EndStep(start_step, True, f"{svc.unit} started", r.exit_status))
    return None, cursor


@dataclass
class _Follow:
    """Following a start's journal: where it is, what it showed, and when."""

    cursor: str | None
    watch: StartupWatch = field(default_factory=StartupWatch)
    shown: str = ""
    shown_at: float = float("-inf")
    # Why the journal cannot be read (set once, then no more reads for this start): on a
    # become = "sudo" host no rule allows `journalctl --after-cursor` (bot.core.sudoers).
    unreadable: str | None = None
    failed_reads: int = 0  # in a row (see FOLLOW_FAILED_READS)

    def text(self) -> str:
        if self.unreadable is not None:
            return f"journal not readable ({self.unreadable}); phase unknown"
        return self.watch.text()


def _unreadable_why(r: CommandResult) -> str:
    """A journal read's failure in a few words, for the progress line."""
    if r.refused is not None:
        return "sudo refused it"
    first = next((ln.strip() for ln in r.stderr.splitlines() if ln.strip()), "")
    return f"{_why(r)}: {first[:80]}" if first else _why(r)


# Journal reads per poll at most. journalctl gives the first ``journal_follow_lines``
# entries after the cursor (systemd issue #14722): a start that logged more since the
# last poll is read on until caught up, so its failure line is seen at once; the bound
# keeps a runaway log from starving the unit and health checks.
FOLLOW_READS_PER_POLL = 10
# Failing journal reads in a row (not refusals: those stop at once) before the follower
# gives up for this start and says the journal is not readable.
FOLLOW_FAILED_READS = 3


def _follow(svc: ServiceSettings, step: Step, follow: _Follow, started: float,
            now: float) -> Generator[Action, Any, None]:
    """Read the journal's new lines (``journal_follow_lines`` a read, until caught up)
    and show the phase: at once when it changes, else every ``progress_interval_s``
    (the elapsed time), so the card's updates do not grow with the log."""
    for _ in range(FOLLOW_READS_PER_POLL if follow.unreadable is None else 0):
        r = yield from _run(step, remote.journal_follow(svc, follow.cursor),
                            svc.command_timeout_s, quiet=True)
        if not r.ok:
            # Refused by sudo, it would be the same at every poll: say so once and stop
            # reading (the health gate decides as ever). Anything else (a lost result, a
            # slow journal's timeout, a failing read) is tried again at the next poll, so
            # one bad read does not switch off the early failure detection.
            if r.refused is not None:
                follow.unreadable = _unreadable_why(r)
            elif not lost(r):
                follow.failed_reads += 1
                if follow.failed_reads >= FOLLOW_FAILED_READS:
                    follow.unreadable = _unreadable_why(r)
            break
        follow.failed_reads = 0
        lines, cursor = new_lines(r.stdout)
        follow.watch.feed(lines)
        follow.cursor = cursor or follow.cursor
        if (len(lines) < svc.journal_follow_lines or cursor is None
                or follow.watch.failure is not None):
            break
    text = follow.text()
    if text != follow.shown or now - follow.shown_at >= svc.progress_interval_s:
        follow.shown, follow.shown_at = text, now
        yield Progress(step, text, now - started, start_up=True)


def _health_wait(svc: ServiceSettings, step: Step, cursor: str | None
                 ) -> Generator[Action, Any, str | None]:
    """Until the unit stays up and /health answers 200; a failure line in the journal
    (``bot.core.startup``) or the unit failing ends the wait at once."""
    yield Emit(BeginStep(step, f"{cmd(remote.unit_is_active(svc))}; GET {svc.health_url}; "
                         f"{cmd(remote.journal_follow(svc, '<cursor>'))}"))
    start = (yield from _tick(0.0)).now
    follow = _Follow(cursor)
    last = "no answer yet"
    while True:
        yield from _follow(svc, step, follow, start, (yield from _tick(0.0)).now)
        if follow.watch.failure is not None:
            return (yield from _failed_start(svc, step, follow))
        active = yield from _run(step, remote.unit_is_active(svc), svc.command_timeout_s,
                                 quiet=True)
        state = active.stdout.strip() or _why(active)
        if state in ("failed", "inactive"):
            msg = f"{svc.unit} is {state} after start"
            journal = yield from _journal(step, svc)
            yield Emit(EndStep(step, False, msg, active.exit_status, journal))
            return msg
        if active.ok:
            h: HttpResult = yield HttpCheck(svc.health_url, HEALTH_REQUEST_TIMEOUT_S)
            if h.ok:
                now = (yield from _tick(0.0)).now
                # What the server logged since the last poll is this start's too: the last
                # phase, a thread that died (a warning, issue 17 D4), a failure line.
                yield from _follow(svc, step, follow, start, now)
                if follow.watch.failure is not None:
                    return (yield from _failed_start(svc, step, follow))
                # A thread's death is a warning: its lines go in the step's output, its
                # last line is in the summary's phase text.
                yield Emit(EndStep(step, True, f"{svc.health_url} answered 200 after "
                                   f"{now - start:.1f}s (last phase: {follow.text()})", None,
                                   thread_block(follow.watch)))
                return None
            last = f"HTTP {h.status}" if h.status is not None else (h.error or "no response")
        else:
            last = f"unit {state}"
        tick = yield from _tick(svc.health_poll_s)
        if tick.now - start >= svc.start_timeout_s:
            msg = f"not healthy after {svc.start_timeout_s:g}s (last: {last})"
            journal = yield from _journal(step, svc)
            yield Emit(EndStep(step, False, msg, None, journal))
            return msg


# How a failed start's reason begins when a journal line said so (bot.core.startup).
STARTUP_FAILED = "start-up failed: "


def _failed_start(svc: ServiceSettings, step: Step, follow: _Follow
                  ) -> Generator[Action, Any, str]:
    """A journal line said the start failed: read once more (the rest of a traceback
    names its cause), then end with those lines and the journal's tail."""
    r = yield from _run(step, remote.journal_follow(svc, follow.cursor), svc.command_timeout_s,
                        quiet=True)
    if r.ok:
        follow.watch.feed(new_lines(r.stdout)[0])
    failure = follow.watch.failure
    assert failure is not None
    msg = f"{STARTUP_FAILED}{describe_failure(failure)}"
    journal = yield from _journal(step, svc)
    # The lines that said so last: a tail (the thread's code block, the audit log's
    # output_tail) keeps them.
    yield Emit(EndStep(step, False, msg, None, f"{journal}\n\n{failure_block(failure)}"))
    return msg


# ---- readiness: the right model, a correct answer, the installed version ------------------

READINESS_OF: dict[Step, Step] = {Step.HEALTH: Step.READINESS,
                                  Step.ROLLBACK_HEALTH: Step.ROLLBACK_READINESS}


class _NotReady(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _http_why(h: HttpResult) -> str:
    if h.status is None:
        return h.error or "no response"
    return f"HTTP {h.status}: {error_message(h.body)}"


def _readiness(svc: ServiceSettings, step: Step) -> Generator[Action, Any, str | None]:
    """``/health`` says the process is alive; this says it serves the configured model,
    answers the smoke prompt correctly and is the installed version. Each check's
    result goes in the step's output (the thread and the audit log). None when ready;
    else why not, handled like an unhealthy start."""
    yield Emit(BeginStep(step, readiness_command(svc)))
    checks: list[str] = []
    try:
        model = yield from _check_models(svc, checks)
        if svc.smoke_prompt is not None and model is not None:
            yield from _check_smoke(svc, svc.smoke_prompt, model, checks)
        yield from _check_version(svc, step, checks)
    except _NotReady as e:
        checks.append(f"FAILED: {e.reason}")
        journal = yield from _journal(step, svc)
        # The checks last, so that a tail (the thread's, the audit log's) keeps them.
        yield Emit(EndStep(step, False, e.reason, None, journal + "\n\n" + "\n".join(checks)))
        return f"not ready: {e.reason}"
    yield Emit(EndStep(step, True, f"{len(checks)} check(s) passed: "
                       + "; ".join(c.split(": ", 1)[1] for c in checks), None,
                       "\n".join(checks)))
    return None


def _check_models(svc: ServiceSettings, checks: list[str]
                  ) -> Generator[Action, Any, str | None]:
    """``GET /v1/models`` lists ``served_model``; returns the model the smoke test asks
    (``served_model``, or the first listed), None when neither check is configured."""
    if svc.served_model is None and svc.smoke_prompt is None:
        return None
    url = f"{api_base(svc)}/v1/models"
    h: HttpResult = yield HttpCheck(url, HEALTH_REQUEST_TIMEOUT_S)
    ids = model_ids(h.body) if h.ok else None
    if ids is None:
        raise _NotReady(f"GET {url}: {_http_why(h) if not h.ok else 'not a model list'}")
    if svc.served_model is None:
        if not ids:
            raise _NotReady(f"GET {url} lists no model")
        return ids[0]
    if svc.served_model not in ids:
        raise _NotReady(f"GET {url} lists {', '.join(ids) or 'no model'}, not "
                        f"{svc.served_model}")
    checks.append(f"ok: GET {url} lists {svc.served_model}")
    return svc.served_model


def _check_smoke(svc: ServiceSettings, prompt: str, model: str, checks: list[str]
                 ) -> Generator[Action, Any, None]:
    url = f"{api_base(svc)}/v1/completions"
    h: HttpResult = yield HttpCheck(url, svc.smoke_timeout_s, "POST",
                                    completion_body(model, prompt, svc.smoke_max_tokens),
                                    "application/json")
    if h.status != 200:
        raise _NotReady(f"POST {url} (model {model}): {_http_why(h)}")
    text = completion_text(h.body)
    if text is None:
        raise _NotReady(f"POST {url} answered 200 without a completion: "
                        f"{error_message(h.body)}")
    shown = repr(text[:120])
    if svc.smoke_expect is not None and not re.search(svc.smoke_expect, text):
        raise _NotReady(f"the smoke completion {shown} does not match {svc.smoke_expect!r}")
    if not text.strip():
        raise _NotReady(f"POST {url} answered an empty completion")
    matched = f", matches {svc.smoke_expect!r}" if svc.smoke_expect else ""
    checks.append(f"ok: POST {url} answered {shown}{matched}")


def _check_version(svc: ServiceSettings, step: Step, checks: list[str]
                   ) -> Generator[Action, Any, None]:
    url = f"{api_base(svc)}/version"
    h: HttpResult = yield HttpCheck(url, HEALTH_REQUEST_TIMEOUT_S)
    reported = reported_version(h.body) if h.ok else None
    if reported is None:
        checks.append(f"skipped: GET {url} reports no version "
                      f"({_http_why(h) if not h.ok else 'no version in the answer'})")
        return
    installed, why, _ = yield from _read_version(step, svc)
    if installed is None:
        checks.append(f"skipped: GET {url} reports {reported}; the installed version is "
                      f"unknown ({why})")
        return
    if not same_release(reported, installed):
        raise _NotReady(f"the server reports version {reported}, but {svc.package} "
                        f"{installed} is installed")
    # vLLM's own version has no `+cu129` label; the wheel's metadata has (versions.py).
    same = "the installed version" if reported == installed else (
        f"the release of the installed {installed}")
    checks.append(f"ok: GET {url} reports {reported}, {same}")


# ---- in-flight requests, before the stop ------------------------------------------------------


# Reads of /metrics that got no answer (a lost connection, a timeout, a 5xx) before the
# load counts as unknown. A server that answered otherwise (404, not Prometheus text, no
# request gauges) is unknown at once: reading again would say the same.
UNKNOWN_LOAD_READS = 3


@dataclass(frozen=True, slots=True)
class _LoadRead:
    load: Load | None
    why: str  # when the load is None: why it is unknown
    final: bool  # reading again would say the same


def _read_load_once(svc: ServiceSettings) -> Generator[Action, Any, _LoadRead]:
    url = metrics_url(svc)
    h: HttpResult = yield HttpCheck(url, HEALTH_REQUEST_TIMEOUT_S)
    if not h.ok:
        return _LoadRead(None, f"{url} did not answer with metrics ({_http_why(h)})",
                         h.status is not None and h.status < 500)
    try:
        load = parse_load(h.body, truncated=h.truncated)
    except MetricsError as e:
        return _LoadRead(None, f"{url}: {e}", True)
    if not load.known:
        # A server started with --disable-log-stats, or an empty body (vllm#8612).
        return _LoadRead(None, f"{url} has no {load.missing()}", True)
    return _LoadRead(load, "", True)


def _read_load(svc: ServiceSettings) -> Generator[Action, Any, tuple[Load | None, str]]:
    """The server's load from /metrics, or None and why it is unknown."""
    read = yield from _read_load_once(svc)
    return read.load, read.why


def _requests_verdict(plan: Plan, svc: ServiceSettings, load: Load, first: Load,
                      elapsed: float) -> tuple[bool, str] | None:
    """Whether to stop now (True) or give up (False), and the step's summary; None to
    wait on."""
    if load.idle:
        return True, ("no request in flight" if first.idle else
                      f"in-flight requests finished after {elapsed:.1f}s "
                      f"(there were {first.describe()})")
    if plan.force:
        return True, f"--force: stopping with {load.describe()}, which are interrupted"
    if svc.request_drain_timeout_s == 0:
        return True, (f"not waiting (request_drain_timeout_s = 0): {load.describe()} "
                      "are interrupted")
    if elapsed >= svc.request_drain_timeout_s:
        return False, f"{load.describe()} still in flight after {svc.request_drain_timeout_s:g}s"
    return None


def _cancelled_before_change(before: str | None
                             ) -> Generator[Action, Any, HostOutcome | None]:
    """A cancel point before the first change: the outcome that ends the run, or None."""
    if (yield from _tick()).cancel_requested:
        return HostOutcome(HostStatus.CANCELLED, "cancelled before anything was changed",
                           before, None)
    return None


def _quiesce_and_stop(plan: Plan, svc: ServiceSettings, before: str | None
                      ) -> Generator[Action, Any, HostOutcome | None]:
    """Wait for in-flight requests (``--force``: not), then stop the unit. None once it
    is stopped; else the outcome that ends the run."""
    held = yield from _drain_requests(plan, svc, before)
    if held is not None:
        return held
    failure = yield from _stop(svc, plan.service)
    if failure is not None:
        return HostOutcome(HostStatus.FAILED, failure, before, None)
    return None


def _drain_requests(plan: Plan, svc: ServiceSettings, before: str | None
                    ) -> Generator[Action, Any, HostOutcome | None]:
    """Before the stop: wait until no request runs or waits on the server (vLLM aborts
    them at a stop), showing the counts live. None to go on with the stop; else the
    run's outcome, with the service untouched. A load that cannot be read is not idle
    (``_unknown_load``)."""
    yield Emit(BeginStep(Step.REQUESTS, requests_command(svc)))
    start = (yield from _tick(0.0)).now
    first: Load | None = None
    seen: deque[str] = deque(maxlen=50)  # each change of the counts, for the record
    unanswered = 0
    while True:
        read = yield from _read_load_once(svc)
        elapsed = (yield from _tick(0.0)).now - start
        load = read.load
        if load is None:
            unanswered += 1
            if read.final or unanswered >= UNKNOWN_LOAD_READS or not _waits(plan, svc):
                return (yield from _unknown_load(plan, svc, before, read.why, seen))
            yield Progress(Step.REQUESTS, f"load unknown ({read.why}); reading again", elapsed)
        else:
            unanswered = 0
            first = first or load
            if not seen or not seen[-1].endswith(load.describe()):
                seen.append(f"{elapsed:7.1f}s  {load.describe()}")
            yield Progress(Step.REQUESTS, load.describe(), elapsed)
            verdict = _requests_verdict(plan, svc, load, first, elapsed)
            if verdict is not None:
                return (yield from _requests_end(before, verdict, seen))
        if (yield from _tick(svc.drain_poll_s)).cancel_requested:
            now = load.describe() if load is not None else "load unknown"
            yield Emit(EndStep(Step.REQUESTS, False, "cancelled while waiting for in-flight "
                               f"requests ({now})"))
            return HostOutcome(HostStatus.CANCELLED, "cancelled while waiting for in-flight "
                               "requests; nothing was changed", before, None)


def _waits(plan: Plan, svc: ServiceSettings) -> bool:
    """Whether the stop waits for requests at all (not with --force or a zero timeout)."""
    return not plan.force and svc.request_drain_timeout_s > 0


def _requests_end(before: str | None, verdict: tuple[bool, str], seen: deque[str]
                  ) -> Generator[Action, Any, HostOutcome | None]:
    go, summary = verdict
    yield Emit(EndStep(Step.REQUESTS, go, summary, None, "\n".join([*seen, summary])))
    if go:
        return None
    return HostOutcome(HostStatus.ABORTED, f"{summary}; service untouched. Try again "
                       "later, or with --force to interrupt them.", before, None)


# The unit states in which no server process runs, so no request can be in flight.
_NOT_RUNNING = ("inactive", "failed")


def _unknown_load(plan: Plan, svc: ServiceSettings, before: str | None, why: str,
                  seen: deque[str]) -> Generator[Action, Any, HostOutcome | None]:
    """/metrics says nothing of the requests (no answer, no vllm: gauges: a server with
    --disable-log-stats). Unknown is not idle (issue 17, D5): the stop would cut whatever
    runs. It goes on only with --force, with request_drain_timeout_s = 0 (the stop never
    waits for requests then, known or not), or when ``systemctl is-active`` says the unit
    does not run (no process, no request to cut); otherwise the run ends ``aborted``."""
    if plan.force:
        verdict = True, (f"--force: stopping with the load unknown ({why}); any request in "
                         "flight is interrupted")
    elif svc.request_drain_timeout_s == 0:
        verdict = True, (f"not waiting (request_drain_timeout_s = 0): the load is unknown "
                         f"({why}); any request in flight is interrupted")
    else:
        r = yield from _run(Step.REQUESTS, remote.unit_is_active(svc), svc.command_timeout_s,
                            quiet=True)
        state = r.stdout.strip() or _why(r)
        if state in _NOT_RUNNING:
            verdict = True, (f"the load is unknown ({why}), but {svc.unit} is {state}: no "
                             "request to interrupt")
        else:
            verdict = False, (f"the load is unknown: {why}, and {svc.unit} is {state}; pass "
                              "--force to stop anyway")
    go, summary = verdict
    yield Emit(EndStep(Step.REQUESTS, go, summary, None, "\n".join([*seen, summary])))
    if go:
        return None
    return HostOutcome(HostStatus.ABORTED, f"{summary}. Service untouched.", before, None)


def _serving(svc: ServiceSettings, props: dict[str, str]) -> Generator[Action, Any, str]:
    """For status: the model(s) served and the load, from the API (when the unit runs)."""
    if props.get("ActiveState") != "active":
        return "API: unit not active"
    url = f"{api_base(svc)}/v1/models"
    h: HttpResult = yield HttpCheck(url, HEALTH_REQUEST_TIMEOUT_S)
    ids = model_ids(h.body) if h.ok else None
    models = (f"serving {', '.join(ids) or 'no model'}" if ids is not None
              else f"models unknown ({_http_why(h) if not h.ok else 'not a model list'})")
    load, why = yield from _read_load(svc)
    return f"{models}; {load.describe() if load is not None else f'load unknown: {why}'}"


def _journal(step: Step, svc: ServiceSettings) -> Generator[Action, Any, str]:
    r = yield from _run(step, remote.journal_tail(svc), svc.command_timeout_s, quiet=True)
    header = f"$ {cmd(remote.journal_tail(svc))}"
    return f"{header}\n{r.output.rstrip()}" if r.output.strip() else f"{header}\n({_why(r)})"


@dataclass(frozen=True, slots=True)
class _Settled:
    known: bool  # uv is gone and the installed version was read
    installed: str | None  # the version installed afterwards (None: missing or unknown)
    why: str  # when not known: what stood in the way


def _settle_install(svc: ServiceSettings, step: Step, started: float
                    ) -> Generator[Action, Any, _Settled]:
    """The result of an install never came back.  uv may still be running on the host
    (OpenSSH does not end a command without a pty when its channel closes; ``timeout``
    only ends it at the install timeout), and installing anything else meanwhile
    would corrupt the venv.  So: reconnect, wait until no install into the venv runs,
    then read what is installed.  Bounded by the time after which ``timeout`` has
    surely ended that install."""
    deadline = started + svc.install_timeout_s + INSTALL_KILL_GRACE_S
    while True:
        p = yield from _run(step, remote.installs_query(svc), svc.command_timeout_s, quiet=True)
        if p.exit_status == 1:  # no install running
            r = yield from _run(step, remote.package_show(svc), svc.command_timeout_s,
                                quiet=True)
            if not lost(r):
                version = remote.parse_package_version(r.stdout) if r.ok else None
                return _Settled(True, version, "")
            why = _why(r)
        elif p.exit_status == 0:
            why = f"uv is still running: {_tail(p.stdout, 1)}"
        elif lost(p):
            why = _why(p)
        else:
            # pgrep's own words (not found, a bad pattern) say why: keep them.
            return _Settled(False, None, f"cannot tell whether uv still runs ({_explain(p)})")
        tick = yield from _tick(svc.drain_poll_s)
        if tick.now >= deadline:
            return _Settled(False, None, why)


def _postcheck(svc: ServiceSettings, host: str) -> Generator[Action, Any, str | None]:
    yield Emit(BeginStep(Step.POSTCHECK, f"{cmd(remote.package_show(svc))}; "
                         f"{cmd(remote.gpu_query())}"))
    after = yield from _version(Step.POSTCHECK, svc)
    try:
        snap = yield from _snapshot(Step.POSTCHECK, svc, host)
    except GpuQueryError as e:
        yield Emit(EndStep(Step.POSTCHECK, True,
                           f"version {after}; GPU table unavailable: {e.reason}"))
        return after
    yield Emit(Snapshot("after restart", snap))
    yield Emit(EndStep(Step.POSTCHECK, True,
                       f"version {after}; {memory_summary(snap)}"))
    return after


def _recover_after_cancel(svc: ServiceSettings, host: str, before: str | None,
                          what: str) -> Flow:
    """Cancelled once the service is down: bring it back on what is installed."""
    err = yield from _start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        left = yield from _left_as(svc, Step.HEALTH, err)
        return HostOutcome(HostStatus.FAILED, f"cancelled {what}; restarting failed: {err}. "
                           f"{left}", before, None)
    after = yield from _postcheck(svc, host)
    return HostOutcome(HostStatus.CANCELLED, f"cancelled {what}; service restarted on {after}",
                       before, after)


# ---- GPU check, per-service GPUs, leftover workers (issue 12) --------------------------


def _in_scope(svc: ServiceSettings, snap: GpuSnapshot) -> GpuSnapshot:
    """The snapshot scoped to the service's GPUs (its ``gpus`` setting; all when unset)."""
    if svc.gpus is None:
        return snap
    return scoped(snap, select_gpus(snap.gpus, svc.gpus))


def _service_workers(svc: ServiceSettings, host: str, snap: GpuSnapshot,
                     workers: tuple[tuple[int, str], ...]
                     ) -> Generator[Action, Any, tuple[tuple[int, str], ...]]:
    """The ``VLLM::`` processes that may be this service's. On a host the service has to
    itself (``gpus`` unset) every one counts, as it always did. With ``gpus`` set another
    service runs beside it: a worker nvidia-smi lists on another GPU, or one in another
    unit's cgroup, is that service's and never blocks this drain."""
    listed = {p.pid for p in snap.processes}
    unlisted = [w for w in workers if w[0] not in listed]
    if svc.gpus is None or not unlisted:
        return workers
    r = yield from _run(Step.DRAIN, facts_query(p for p, _ in unlisted), svc.command_timeout_s,
                        quiet=True)
    _check_reached(host, r)
    if r.exit_status not in (0, 1):
        return workers  # cannot tell whose they are: each still counts
    facts = parse_facts(r.stdout)
    ours = service_name(svc.unit)
    keep = {p for p, _ in unlisted
            if p in facts and not facts[p].zombie
            and (ours in facts[p].units() or not facts[p].units())}
    return tuple(w for w in workers if w[0] in listed or w[0] in keep)


def _read_health(step: Step, svc: ServiceSettings, host: str, gpus: tuple[Gpu, ...],
                 warnings: tuple[DriverWarning, ...] = ()
                 ) -> Generator[Action, Any, tuple[HostHealth, GpuStateRead]]:
    """The GPUs' state (NVML or ``nvidia-smi -q``, as the executor can) and the kernel's
    Xid lines, judged per GPU (bot.core.health): the same verdict whichever source.
    ``warnings``: what the GPU query warned about (a corrupted infoROM)."""
    fallback = RunCommand(step, HEALTH_QUERY_ARGV, svc.command_timeout_s, True,
                          run_as=run_as_of(HEALTH_QUERY_ARGV))
    state: GpuStateRead = yield ReadGpuState(fallback)
    readings, notes = state.judged(host)
    reads = health_reads(host, gpus, readings, notes, warnings)
    result: CommandResult | None = None
    try:
        while True:
            argv = reads.send(result)  # type: ignore[arg-type]  # None only to start it
            result = yield from _run(step, argv, svc.command_timeout_s, quiet=True)
    except StopIteration as stop:
        health: HostHealth = stop.value
        return health, state


def _read_gpu_check(svc: ServiceSettings, host: str) -> Generator[Action, Any, GpuCheck]:
    """The GPU check's reads and verdict, without its step: the host lists every GPU the
    service needs, and none of them is critical. Read-only; the run's check before the
    stop and the approval card's read at the request (``gpu_health_flow``) share it, so
    both judge alike."""
    listed: tuple[Gpu, ...] = ()
    warnings: tuple[DriverWarning, ...] = ()
    failure: str | None = None
    try:
        snap = yield from _snapshot(Step.GPU_CHECK, svc, host)
        listed, warnings = snap.gpus, snap.warnings
    except _HostLost as e:
        return GpuCheck(f"cannot reach {host} to check its GPUs ({e.reason})")
    except GpuQueryError as e:
        failure = f"cannot read the GPUs: {e.reason}"
    selection = select_gpus(listed, svc.gpus)
    scope = selection.uuids if svc.gpus is not None else None
    health, state = yield from _read_health(Step.GPU_CHECK, svc, host, listed, warnings)
    critical = health.problems(Level.CRITICAL, scope)
    listing = failure or selection.refusal(host, listed)
    reasons = [listing] if listing else []
    if critical:
        reasons.append(f"not fit to run on: {'; '.join(critical)}")
    return GpuCheck("; ".join(reasons) or None, health, scope, selection.wanted, listing,
                    state.said())


def _gpu_check(svc: ServiceSettings, host: str, local: bool
               ) -> Generator[Action, Any, GpuCheck]:
    """Before anything changes: the host lists every GPU the service needs (a host with
    none, or fewer, is never drained) and none of them is critical (ECC, row remap,
    recovery action, Xid errors); warnings go on the card. Refusing leaves the service
    untouched. ``local``: the bot runs on the host, so NVML reads the GPUs' state."""
    yield Emit(BeginStep(Step.GPU_CHECK, gpu_check_command(svc, local)))
    check = yield from _read_gpu_check(svc, host)
    health, scope = check.health, check.scope
    if health is None:
        yield Emit(EndStep(Step.GPU_CHECK, False, check.refusal or "not reached"))
        return check
    # The output always says what the state was read with; the findings when any.
    evidence = f"{check.read_with}\n{details(health, scope)}"
    if check.refusal is not None:
        yield Emit(EndStep(Step.GPU_CHECK, False, check.refusal, None, evidence))
        return check
    warned = bool(health.problems(Level.WARN, scope))
    yield Emit(EndStep(Step.GPU_CHECK, True, f"{check.wanted} listed; "
                       f"{health.summary(scope)}", None,
                       evidence if warned else check.read_with))
    return check


def gpu_health_flow(svc: ServiceSettings, host: str) -> Flow:
    """The service's GPUs' health read when a run is requested (before anyone approves),
    for the approval card: the GPU check's own reads and verdict, without its step.
    Changes nothing on the host; the verdict is emitted as a ``Health`` notice."""
    check = yield from _read_gpu_check(svc, host)
    yield Emit(Health(check))
    if check.health is None:
        return HostOutcome(HostStatus.FAILED, check.refusal or "not reached")
    return HostOutcome(HostStatus.SUCCEEDED, check.refusal or check.health.summary(check.scope))


def _gpu_recheck(svc: ServiceSettings, host: str, check: GpuCheck,
                 outcome: HostOutcome, local: bool) -> Flow:
    """After a run that left the service up: the GPU check again, and the Xid errors
    that appeared during the run. They do not undo the run (the service passed its
    gates); they are named in its summary, with NVIDIA's action."""
    if check.health is None or outcome.status not in (HostStatus.SUCCEEDED,
                                                      HostStatus.ROLLED_BACK):
        return outcome
    yield Emit(BeginStep(Step.GPU_RECHECK, gpu_recheck_command(local)))
    warnings: tuple[DriverWarning, ...] = ()
    try:
        snap = yield from _snapshot(Step.GPU_RECHECK, svc, host)
        gpus, warnings = snap.gpus, snap.warnings
    except GpuQueryError:
        gpus = ()
    health, state = yield from _read_health(Step.GPU_RECHECK, svc, host, gpus, warnings)
    new = new_xids(check.health.xids, health.xids)
    critical = health.problems(Level.CRITICAL, check.scope)
    if not new and not critical:
        yield Emit(EndStep(Step.GPU_RECHECK, True, f"no new Xid error during the run; "
                           f"{health.summary(check.scope)}", None, state.said()))
        return outcome
    judged = judge(host, gpus, health.readings, new)
    news = judged.problems(Level.CRITICAL) + judged.problems(Level.WARN)
    said = (f"{len(new)} NEW Xid error(s) during the run: {'; '.join(news)}" if new
            else "no new Xid error")
    said += f"; CRITICAL now: {'; '.join(critical)}" if critical else ""
    yield Emit(EndStep(Step.GPU_RECHECK, False, said, None,
                       f"{state.said()}\n{details(health, check.scope)}"))
    return HostOutcome(outcome.status, f"{outcome.summary}; {said}", outcome.version_before,
                       outcome.version_after)


LeftoverEnd = Literal["cleaned", "failed", "cancelled"]


def _drain_clean(svc: ServiceSettings, host: str
                 ) -> Generator[Action, Any, tuple[DrainEnd, str | None]]:
    """The drain; when it times out on processes of the service itself (workers that
    outlived the unit), an approver may have them terminated, and the drain resumes."""
    end, reason = yield from _drain(svc, host)
    if end != "failed":
        return end, reason
    try:
        _, verdict = yield from _drain_poll(svc, host)
    except GpuQueryError:
        return end, reason  # the host did not answer or nvidia-smi failed: nothing to judge
    if not verdict.drained:
        cleaned, why = yield from _leftovers(svc, host, verdict, reason or "")
        if cleaned == "cancelled":
            return "cancelled", None
        if cleaned == "failed":
            return "failed", why
    return (yield from _drain(svc, host))  # terminated, or released meanwhile


def _leftovers(svc: ServiceSettings, host: str, verdict: DrainVerdict, timed_out: str
               ) -> Generator[Action, Any, tuple[LeftoverEnd, str]]:
    """Whose processes still hold the service's GPUs; only when every one is the
    service's own, an approver's go, then SIGTERM and SIGKILL to exactly those."""
    found = candidates(verdict)
    if found.missing or not (found.processes or found.memory_only):
        return "failed", timed_out
    if not found.processes:
        return "failed", (f"{timed_out}. It needs a GPU reset or a reboot: "
                          f"{memory_without_process(host, found.memory_only)}")
    pids = [p for p, *_ in found.processes]
    r = yield from _run(Step.DRAIN, facts_query(pids), svc.command_timeout_s, quiet=True)
    u = yield from _run(Step.DRAIN, unit_user_query(svc.unit, svc.systemctl),
                        svc.command_timeout_s, quiet=True)
    if r.exit_status not in (0, 1) or not u.ok:
        bad = r if r.exit_status not in (0, 1) else u
        return "failed", f"{timed_out}; whose processes they are is unknown ({_explain(bad)})"
    # A unit with no User= runs as root, but a root VLLM:: process outside every unit
    # may be anyone's (a `vllm serve` in an admin's session): only the unit's cgroup
    # makes it the service's then. The host's signal script judges the same way.
    leftovers = classify(found, parse_facts(r.stdout), svc.unit, u.stdout.strip())
    others = [x.describe() for x in leftovers if x.owner == Owner.OTHER]
    if others:
        return "failed", (f"{timed_out}. Processes that are not {svc.unit}'s hold its GPUs; "
                          f"they were not signalled: {'; '.join(others)}")
    ours = [x for x in leftovers if x.owner == Owner.SERVICE]
    stuck = [x for x in ours if x.facts is not None and x.facts.uninterruptible]
    if stuck:
        return "failed", (f"{timed_out}. It needs a GPU reset or a reboot: "
                          + "; ".join(f"{x.describe()}, in uninterruptible sleep (state "
                                      f"{x.facts.state if x.facts else '?'}): no signal "
                                      "reaches it" for x in stuck))
    if not ours:
        return "cleaned", ""  # they all exited meanwhile
    answer: Approval = yield AskApproval(prompt(host, svc.unit, ours), tuple(x.pid for x in ours))
    if (yield from _tick()).cancel_requested:
        return "cancelled", ""
    if answer.approved_by is None:
        return "failed", (f"{timed_out}. The leftover processes were not terminated: "
                          f"{answer.reason}")
    return (yield from _terminate(svc, host, ours, answer.approved_by, timed_out))


def _terminate(svc: ServiceSettings, host: str, ours: list[Leftover], approved_by: str,
               timed_out: str) -> Generator[Action, Any, tuple[LeftoverEnd, str]]:
    """SIGTERM, wait, SIGKILL to those that remain, wait: each signal only to a PID whose
    start time is unchanged. One that survives SIGKILL needs a GPU reset or a reboot."""
    targets = [x.facts for x in ours if x.facts is not None]
    yield Emit(BeginStep(Step.LEFTOVERS, f"approved by {approved_by}: "
                         f"{shown_signal('TERM', targets)}; after up to {svc.kill_grace_s:g}s "
                         "SIGKILL to any that remain"))
    remaining = targets
    for sig in ("TERM", "KILL"):
        if not remaining:
            break
        r = yield from _run(Step.LEFTOVERS, signal_command(sig, remaining, svc.unit,
                                                           svc.systemctl, ps=svc.ps,
                                                           kill=svc.kill),
                            svc.command_timeout_s)
        refused = sorted(p for p, what in parse_signalled(r.stdout).items() if what == "refused")
        if refused:
            # The host's own check disagreed with ours (the process changed owner since
            # the approver saw it): nothing more is signalled.
            msg = (f"the host refused to signal PID(s) {', '.join(map(str, refused))}: not in "
                   f"{service_name(svc.unit)}'s cgroup, nor a VLLM:: process of its user")
            yield Emit(EndStep(Step.LEFTOVERS, False, msg))
            return "failed", f"{timed_out}. {msg}"
        remaining = yield from _still_running(svc, host, remaining)
    if remaining:
        states = "; ".join(f"PID {t.pid} state {t.state}" for t in remaining)
        msg = (f"{len(remaining)} process(es) survived SIGKILL ({states}): it needs a GPU reset "
               "or a reboot")
        yield Emit(EndStep(Step.LEFTOVERS, False, msg))
        return "failed", f"{timed_out}. {msg}"
    yield Emit(EndStep(Step.LEFTOVERS, True, f"{len(targets)} leftover process(es) ended "
                       f"({', '.join(str(t.pid) for t in targets)}), approved by {approved_by}"))
    return "cleaned", ""


def _still_running(svc: ServiceSettings, host: str, targets: list[ProcFacts]
                   ) -> Generator[Action, Any, list[ProcFacts]]:
    """Poll until every target has exited (or is a zombie, holding nothing), at most
    ``kill_grace_s``; the targets still running then, with their state now."""
    start = (yield from _tick(0.0)).now
    remaining = targets
    while True:
        r = yield from _run(Step.LEFTOVERS, facts_query(t.pid for t in remaining),
                            svc.command_timeout_s, quiet=True)
        if r.exit_status in (0, 1):
            now = parse_facts(r.stdout)
            remaining = [now[t.pid] for t in remaining
                         if t.pid in now and now[t.pid].started == t.started
                         and not now[t.pid].zombie]
        if not remaining:
            return []
        tick = yield from _tick(svc.drain_poll_s)
        if tick.now - start >= svc.kill_grace_s:
            return remaining


# ---- flows ------------------------------------------------------------------------------


class _Refused(Exception):
    """A preflight check refuses; raised out of the check so the next ones never run."""

    def __init__(self, reason: str, evidence: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence  # a quiet query's output that explains the refusal


@dataclass(frozen=True, slots=True)
class _Preflight:
    """What preflight found, for the steps after it."""

    before: str | None  # the installed version: what a rollback reinstalls
    target: str | None  # the version the install should leave (None: not known)
    refusal: str | None = None  # why it refused; None when every check passed
    env: _Env | None = None  # the environment snapshot a rollback restores


def _preflight(plan: Plan, svc: ServiceSettings, host: str) -> Generator[Action, Any, _Preflight]:
    """Everything that can refuse does so while the service is untouched: the unit is
    loaded, the installed version is known (a rollback needs it), the venv's disk has
    room and the install resolves."""
    yield Emit(BeginStep(Step.PREFLIGHT, next(s.command for s in plan.steps
                                              if s.step == Step.PREFLIGHT)))
    before: str | None = None
    try:
        props = yield from _preflight_unit(svc, host)
        before = yield from _preflight_version(svc)
        avail = yield from _preflight_disk(svc)
        target, dry_output = yield from _preflight_dry_run(plan, svc)
        env = yield from _preflight_snapshot(plan, svc, dry_output)
    except _Refused as e:
        yield Emit(EndStep(Step.PREFLIGHT, False, e.reason, None, e.evidence))
        return _Preflight(before, None, e.reason)
    yield Emit(Versions(before, None))
    yield Emit(EndStep(Step.PREFLIGHT, True,
                       f"{svc.unit} {props.get('ActiveState', '?')}, {svc.package} {before}, "
                       f"{avail:,} MiB free, {plan.spec} resolves"
                       + (f" to {target}" if target and not plan.version else "")
                       + f"; changes: {env.planned.headline()}; snapshot of "
                       f"{env.freeze.count} packages"
                       + ("" if plan.dry_run else f" kept as {env.lock}")))
    return _Preflight(before, target, env=env)


def _preflight_unit(svc: ServiceSettings, host: str) -> Generator[Action, Any, dict[str, str]]:
    """The unit's properties; refuses when the host is unreachable or the unit not loaded."""
    r, props = yield from _unit_state(Step.PREFLIGHT, svc)
    refusal = (f"cannot reach {host} over SSH: {_why(r)}" if lost(r)
               else _check_unit(svc, r, props))
    if refusal is not None:
        raise _Refused(refusal)
    return props


def _preflight_version(svc: ServiceSettings) -> Generator[Action, Any, str]:
    before, why, evidence = yield from _read_version(Step.PREFLIGHT, svc)
    if before is None:
        raise _Refused(f"cannot read the installed {svc.package} version, so a rollback "
                       f"would be impossible ({why})", evidence)
    return before


def _preflight_disk(svc: ServiceSettings) -> Generator[Action, Any, int]:
    """Free MiB on the venv's file system; refuses under ``min_free_disk_mib``."""
    df = yield from _run(Step.PREFLIGHT, remote.free_disk(svc), svc.command_timeout_s)
    avail = remote.parse_df_avail_mib(df.stdout) if df.ok else None
    if avail is None:
        raise _Refused(f"cannot read free disk space of {svc.venv_dir} ({_explain(df)})")
    if avail < svc.min_free_disk_mib:
        raise _Refused(f"only {avail:,} MiB free on {svc.venv_dir}; "
                       f"need {svc.min_free_disk_mib:,} MiB")
    return avail


def _preflight_dry_run(plan: Plan, svc: ServiceSettings
                       ) -> Generator[Action, Any, tuple[str | None, str]]:
    """``uv pip install --dry-run``; returns the version the install should leave, and
    uv's report (its `` - ``/`` + ``/`` ~ `` lines, on stderr)."""
    dry_argv = remote.install_dry_run(svc, plan.spec, plan.index_url)
    dry = yield from _run(Step.PREFLIGHT, dry_argv, svc.install_timeout_s,
                          stdin=remote.index_input(plan.index_url))
    if not dry.ok:
        raise _Refused(f"install dry run failed ({_why(dry)}): {_tail(dry.output, 4)}")
    if plan.version is not None:
        return plan.version, dry.output
    # What "latest" means now: after a lost connection, the version to look for.
    return remote.parse_resolved_version(dry.output, svc.package), dry.output


# ---- the whole environment: snapshot, prefetch, import gate, rollback (issue 10) -------


@dataclass(frozen=True, slots=True)
class _Env:
    """The environment before anything changed, and what the install should change."""

    freeze: Freeze  # the snapshot (``uv pip freeze``)
    lock: str  # where the snapshot is kept on the host: what a rollback syncs to
    planned: PackageDiff  # the dry run's changes
    # Everything the install installs (the dry run's `+` and `~` lines): what the prefetch
    # puts in uv's cache. Not the whole snapshot: what the install leaves alone (a CUDA 12
    # wheel a CUDA 13 release no longer needs) may be gone from the index already. Name ->
    # its requirement line: `name==version`, or `name @ URL` for a direct-URL wheel.
    installs: Mapping[str, str] = field(default_factory=dict)


def _preflight_snapshot(plan: Plan, svc: ServiceSettings, dry_output: str
                        ) -> Generator[Action, Any, _Env]:
    """``uv pip freeze`` of the venv, kept on the host next to it (so a rollback never
    depends on the bot) and recorded in the audit log. A snapshot that cannot be taken
    or saved refuses the run: without it no rollback could restore what was there."""
    argv = remote.freeze(svc)
    r = yield from _run(Step.PREFLIGHT, argv, svc.command_timeout_s, quiet=True)
    if not r.ok:
        raise _Refused(f"cannot take the environment snapshot, so a rollback could not "
                       f"restore it (`{cmd(argv)}`: {_explain(r)})", _evidence(argv, r))
    snapshot = parse_freeze(r.stdout)
    if not snapshot.versions:
        raise _Refused(f"the environment snapshot is empty (`{cmd(argv)}` listed no "
                       "package), so a rollback could not restore it", _evidence(argv, r))
    twice = snapshot.unrestorable()
    if twice is not None:  # `uv pip sync` of it would fail: no rollback could work
        raise _Refused(f"snapshot not restorable: {twice}; `uv pip sync` cannot require "
                       "two versions of one package. Remove the stale `.dist-info` "
                       f"directory from {svc.venv_dir}'s site-packages, then ask again",
                       _evidence(argv, r))
    lock = remote.lock_path(svc, snapshot.digest)
    if not plan.dry_run:  # a dry run writes nothing on the host
        save = remote.save_lock(svc, lock)
        s = yield from _run(Step.PREFLIGHT, save, svc.command_timeout_s, quiet=True,
                            stdin=snapshot.text.encode())
        if not s.ok:
            raise _Refused(f"cannot save the environment snapshot on the host as {lock} "
                           f"({_explain(s)})", _evidence(save, s))
    changes = parse_install_changes(dry_output)
    env = _Env(snapshot, lock, planned_diff(snapshot, changes), parse_install_set(dry_output))
    yield Emit(Packages(EnvKind.SNAPSHOT, None, snapshot.text, None if plan.dry_run else lock))
    yield Emit(Packages(EnvKind.PLANNED, env.planned))
    return env


def _size(n: int | None) -> str:
    if n is None:
        return "nothing downloaded"
    return f"{n / 1024**3:.1f} GiB downloaded" if n >= 1024**3 else (
        f"{n / 1024**2:.1f} MiB downloaded")


def _prefetch(plan: Plan, svc: ServiceSettings, env: _Env) -> Generator[Action, Any, str | None]:
    """Before the stop, fetch every wheel the install needs into uv's cache (what the
    dry run says the install installs, pinned, installed into a throwaway venv that is
    removed), so the outage holds no download. None when done, else why not (the
    service is untouched)."""
    argv = remote.prefetch(svc, plan.index_url)
    yield Emit(BeginStep(Step.PREFETCH, remote.prefetch_shown(svc, plan.index_url)))
    pins = "".join(f"{r}\n" for _, r in sorted(env.installs.items()))
    stdin = (remote.index_input(plan.index_url) or b"") + pins.encode()
    started = (yield from _tick(0.0)).now
    r = yield from _run(Step.PREFETCH, argv, svc.install_timeout_s, stdin=stdin)
    took = (yield from _tick(0.0)).now - started
    if not r.ok:
        why = ("connection lost during the prefetch" if lost(r)
               else _failed("prefetch", r, svc.install_timeout_s))
        yield Emit(EndStep(Step.PREFETCH, False, why, r.exit_status))
        return f"{why}: {_tail(r.output, 3)}" if not r.timed_out and not lost(r) else why
    yield Emit(EndStep(Step.PREFETCH, True,
                       f"{len(env.installs)} packages in uv's cache, "
                       f"{_size(downloaded_bytes(r.output))} in {took:.1f}s", r.exit_status))
    return None


def _gate(svc: ServiceSettings, env: _Env, target: str | None
          ) -> Generator[Action, Any, str | None]:
    """Between install and start: record what the install really changed, then let the
    venv's own interpreter import vllm and torch and compare torch's CUDA build with what
    the driver supports. None when the new environment may start, else which check
    failed and why (the step's output holds the interpreter's words)."""
    yield Emit(BeginStep(Step.GATE, f"{cmd(remote.freeze(svc))}; {cmd(remote.driver_info())}; "
                         f"{svc.python} -c 'import vllm, torch'"))
    yield from _record_change(svc, env, EnvKind.INSTALLED)
    smi = yield from _run(Step.GATE, remote.driver_info(), svc.command_timeout_s, quiet=True)
    driver_cuda = parse_driver_cuda(smi.stdout) if smi.ok else None
    g = yield from _run(Step.GATE, remote.import_gate(svc), svc.gate_timeout_s)
    report = parse_gate_output(g.stdout) if g.ok else None
    verdict = gate_verdict(report, target=target, driver_cuda=driver_cuda,
                           package=svc.package)
    if verdict.ok:
        # A warning (torch's CUDA minor newer than the driver's) goes in the output too.
        yield Emit(EndStep(Step.GATE, True, verdict.reason, g.exit_status,
                           f"WARNING: {verdict.warning}" if verdict.warning else ""))
        return None
    said = _tail(g.output, 1) if report is None else ""
    why = verdict.reason + (f": {said}" if said else f" ({_why(g)})" if not g.ok else "")
    yield Emit(EndStep(Step.GATE, False, f"{verdict.check} check failed: {why}",
                       g.exit_status))
    return f"the import gate refused the start ({verdict.check} check failed: {why})"


def _record_change(svc: ServiceSettings, env: _Env, kind: EnvKind
                   ) -> Generator[Action, Any, PackageDiff | None]:
    """The freeze now, compared with the snapshot, recorded as ``kind``; None (and a
    note saying why) when the freeze cannot be read."""
    r = yield from _run(Step.GATE if kind == EnvKind.INSTALLED else Step.POSTCHECK,
                        remote.freeze(svc), svc.command_timeout_s, quiet=True)
    if not r.ok:
        yield Emit(Packages(kind, None, note=f"`{cmd(remote.freeze(svc))}`: {_explain(r)}"))
        return None
    diff = diff_freezes(env.freeze, parse_freeze(r.stdout))
    yield Emit(Packages(kind, diff))
    return diff


def _restore(plan: Plan, svc: ServiceSettings, before: str | None, env: _Env
             ) -> Generator[Action, Any, tuple[InstallEnd, str]]:
    """``uv pip sync`` of the snapshot: from uv's cache first (no network: a build the
    index no longer serves comes back too), then from the index."""
    offline = remote.sync_lock(svc, env.lock, offline=True)
    verdict, why = yield from _install(svc, Step.ROLLBACK, offline, before,
                                       "rollback from uv's cache",
                                       f"restored the snapshot from uv's cache ({env.lock})",
                                       None)
    if verdict != "failed":
        return verdict, why
    online = remote.sync_lock(svc, env.lock, offline=False, index_url=plan.index_url)
    return (yield from _install(svc, Step.ROLLBACK, online, before, "rollback from the index",
                                f"restored the snapshot from the index ({env.lock})",
                                remote.index_input(plan.index_url)))


def preview_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """What a redeploy would change, read when it is requested (before anyone approves):
    the freeze and the install's dry run, compared. Changes nothing on the host; the
    change is emitted as a ``Packages(PREVIEW)`` notice, and the outcome says why not
    when it cannot be read."""
    frozen = yield from _run(Step.PREFLIGHT, remote.freeze(svc), svc.command_timeout_s,
                             quiet=True)
    if not frozen.ok:
        return HostOutcome(HostStatus.FAILED, f"cannot read the environment "
                           f"(`{cmd(remote.freeze(svc))}`: {_explain(frozen)})")
    dry = yield from _run(Step.PREFLIGHT, remote.install_dry_run(svc, plan.spec, plan.index_url),
                          svc.install_timeout_s, quiet=True,
                          stdin=remote.index_input(plan.index_url))
    if not dry.ok:
        return HostOutcome(HostStatus.FAILED, f"install dry run failed ({_why(dry)}): "
                           f"{_tail(dry.output, 3)}")
    diff = planned_diff(parse_freeze(frozen.stdout), parse_install_changes(dry.output))
    yield Emit(Packages(EnvKind.PREVIEW, diff))
    return HostOutcome(HostStatus.SUCCEEDED, diff.headline())


def rollback_command(svc: ServiceSettings, lock: str) -> str:
    """What an operator types to restore the snapshot by hand."""
    return (f"{cmd(remote.unit_stop(svc))} && {cmd(remote.sync_lock(svc, lock, offline=True))}"
            f" && {cmd(remote.unit_start(svc))}")


def _rollback_stop(svc: ServiceSettings, host: str) -> Generator[Action, Any, str | None]:
    """Stop the new version that never turned healthy and wait for its GPU memory, so
    the snapshot can be restored under a stopped service. None when stopped and free."""
    argv = remote.unit_stop(svc)
    yield Emit(BeginStep(Step.ROLLBACK_STOP, f"{cmd(argv)}; poll GPU memory until released"))
    r = yield from _run(Step.ROLLBACK_STOP, argv, svc.stop_timeout_s)
    if not r.ok:
        msg = _failed("systemctl stop", r, svc.stop_timeout_s)
        yield Emit(EndStep(Step.ROLLBACK_STOP, False, msg, r.exit_status))
        return msg
    start = (yield from _tick(0.0)).now
    why = "no answer yet"
    while (yield from _tick(0.0)).now - start < svc.drain_timeout_s:
        try:
            _, verdict = yield from _drain_poll(svc, host)
        except GpuQueryError as e:
            why = e.reason
        else:
            if verdict.drained:
                yield Emit(EndStep(Step.ROLLBACK_STOP, True, f"{svc.unit} stopped, GPU "
                                   "memory released"))
                return None
            why = verdict.describe()
        yield Sleep(svc.drain_poll_s)
    msg = f"GPU memory still held {svc.drain_timeout_s:g}s after the stop: {why}"
    yield Emit(EndStep(Step.ROLLBACK_STOP, False, msg))
    return msg


def _unhealthy(plan: Plan, svc: ServiceSettings, host: str, before: str | None, err: str,
               env: _Env) -> Flow:
    """The new version started but never turned healthy: roll back (``rollback_on_unhealthy``,
    the default) or stop there with the exact command to roll back."""
    if not svc.rollback_on_unhealthy:
        left = yield from _left_as(svc, Step.HEALTH, err)
        return HostOutcome(HostStatus.FAILED, f"{err}. {plan.spec} is installed and not "
                           "healthy; rollback_on_unhealthy is off, so nothing was rolled "
                           f"back. {left} Roll back with: "
                           f"`{rollback_command(svc, env.lock)}`", before, None)
    stopped = yield from _rollback_stop(svc, host)
    if stopped is not None:
        return HostOutcome(HostStatus.FAILED, f"{err}; stopping it to roll back failed: "
                           f"{stopped}. Nothing was rolled back. Roll back with: "
                           f"`{rollback_command(svc, env.lock)}`", before, None)
    return (yield from _rollback(plan, svc, host, before, err, env))


def _postcheck_restored(svc: ServiceSettings, host: str, env: _Env
                        ) -> Generator[Action, Any, tuple[str | None, str | None]]:
    """The post-check after a rollback: the version, the GPUs, and whether the freeze is
    the snapshot again. Returns (version, how it differs from the snapshot or None)."""
    yield Emit(BeginStep(Step.POSTCHECK, f"{cmd(remote.freeze(svc))}; "
                         f"{cmd(remote.package_show(svc))}; {cmd(remote.gpu_query())}"))
    diff = yield from _record_change(svc, env, EnvKind.RESTORED)
    after = yield from _version(Step.POSTCHECK, svc)
    if diff is None:
        differs: str | None = ("the environment cannot be read, so it is not known to be "
                               "the snapshot")
    elif diff.changes:
        differs = f"the environment DIFFERS from the snapshot: {diff.headline()}"
    else:
        differs = None
    env_text = differs or f"environment equals the snapshot ({env.freeze.count} packages)"
    try:
        snap = yield from _snapshot(Step.POSTCHECK, svc, host)
    except GpuQueryError as e:
        gpus = f"GPU table unavailable: {e.reason}"
    else:
        yield Emit(Snapshot("after restart", snap))
        gpus = memory_summary(snap)
    yield Emit(EndStep(Step.POSTCHECK, differs is None, f"version {after}; {env_text}; {gpus}"))
    return after, differs


def redeploy_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Preflight, stop, drain, reinstall (rollback on failure), start, health, post-check."""
    pre = yield from _preflight(plan, svc, host)
    before = pre.before
    if pre.refusal is not None:
        return HostOutcome(HostStatus.ABORTED,
                           f"preflight refused; service untouched: {pre.refusal}", before, None)
    assert pre.env is not None  # preflight refuses without a snapshot
    check = yield from _gpu_check(svc, host, plan.is_local(host))
    if check.refusal is not None:
        return HostOutcome(HostStatus.ABORTED,
                           f"preflight refused; service untouched: {check.refusal}", before, None)
    if plan.dry_run:
        return HostOutcome(HostStatus.SUCCEEDED, f"dry run: preflight passed; would install "
                           f"{plan.spec}, changing {pre.env.planned.headline()}", before, None)

    # A cancel that came during the preflight takes effect before the prefetch's downloads.
    if (ended := (yield from _cancelled_before_change(before))) is not None:
        return ended
    fetch_failed = yield from _prefetch(plan, svc, pre.env)
    if fetch_failed is not None:
        return HostOutcome(HostStatus.ABORTED, f"prefetch failed; service untouched: "
                           f"{fetch_failed}", before, None)

    if (ended := (yield from _cancelled_before_change(before))) is not None:
        return ended
    if (ended := (yield from _quiesce_and_stop(plan, svc, before))) is not None:
        return ended

    drain, reason = yield from _drain_clean(svc, host)
    if drain == "cancelled":
        return (yield from _recover_after_cancel(svc, host, before, "during drain"))
    if drain == "failed":
        return HostOutcome(HostStatus.FAILED, f"{reason}. The service is STOPPED and nothing "
                           "was reinstalled; free the GPUs, then restart it.", before, None)
    outcome = yield from _reinstall_and_start(plan, svc, host, before, pre.target, pre.env)
    return (yield from _gpu_recheck(svc, host, check, outcome, plan.is_local(host)))


def _reinstall_and_start(plan: Plan, svc: ServiceSettings, host: str, before: str | None,
                         target: str | None, env: _Env) -> Flow:
    """The service is stopped and its GPUs free: reinstall, import-gate, start,
    health-gate and post-check; a failed reinstall, gate or health gate restores the
    environment snapshot."""
    install = remote.install(svc, plan.spec, plan.index_url)
    verdict, why = yield from _install(svc, Step.REINSTALL, install, target, "reinstall",
                                       f"installed {plan.spec}",
                                       remote.index_input(plan.index_url))
    if verdict == "unknown":
        return HostOutcome(
            HostStatus.FAILED, f"{why}. Whether {plan.spec} was installed is unknown, and "
            f"the service is STOPPED. {_status_hint(plan.service)} once the host answers.",
            before, None)
    if verdict == "failed":
        yield from _record_change(svc, env, EnvKind.INSTALLED)  # what the failure left
        return (yield from _rollback(plan, svc, host, before, why, env))

    refused = yield from _gate(svc, env, target)
    if refused is not None:
        return (yield from _rollback(plan, svc, host, before, refused, env))

    # A reinstall is never interrupted; a cancel that arrived meanwhile takes effect now.
    if (yield from _tick()).cancel_requested:
        return (yield from _recover_after_cancel(svc, host, before, "after the reinstall"))

    err = yield from _start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        return (yield from _unhealthy(plan, svc, host, before, err, env))
    after = yield from _postcheck(svc, host)
    return HostOutcome(HostStatus.SUCCEEDED, f"{svc.package} {before} -> {after}, healthy",
                       before, after)


def _install(svc: ServiceSettings, step: Step, argv: tuple[str, ...], target: str | None,
             what: str, done: str, stdin: bytes | None
             ) -> Generator[Action, Any, tuple[InstallEnd, str]]:
    """Run an install (the reinstall or the rollback): how it ended, and why.

    A cut connection may leave uv running on the host, and installing anything else
    meanwhile would corrupt the venv: wait until uv has ended, then judge by the
    version that is installed (``target``)."""
    yield Emit(BeginStep(step, cmd(argv)))
    started = (yield from _tick(0.0)).now
    r = yield from _run(step, argv, svc.install_timeout_s, stdin=stdin)
    if lost(r):
        cut = f"connection lost during the {what} ({_why(r)})"
        settled = yield from _settle_install(svc, step, started)
        if not settled.known:
            why = f"{cut}; then {settled.why}"
            yield Emit(EndStep(step, False, why))
            return "unknown", why
        if not same_release(settled.installed, target):
            why = (f"{cut}; once uv had ended, {svc.package} was "
                   f"{settled.installed or 'missing'}, not {target or 'a known version'}")
            yield Emit(EndStep(step, False, why))
            return "failed", why
        yield Emit(EndStep(step, True, f"{cut}; uv finished on the host and {svc.package} "
                           f"{settled.installed} is installed"))
        return "ok", ""
    if not r.ok:
        why = _failed(what, r, svc.install_timeout_s)
        yield Emit(EndStep(step, False, why, r.exit_status))
        return "failed", why
    yield Emit(EndStep(step, True, done, r.exit_status))
    return "ok", ""


def _rollback(plan: Plan, svc: ServiceSettings, host: str, before: str | None,
              cause: str, env: _Env) -> Flow:
    """Restore the whole environment snapshot (every package at its version), start it,
    health-gate it, and check that the freeze is the snapshot again."""
    verdict, why = yield from _restore(plan, svc, before, env)
    by_hand = f"`{cmd(remote.sync_lock(svc, env.lock, offline=True))}`"
    if verdict == "unknown":
        return HostOutcome(
            HostStatus.FAILED, f"{cause}; {why}. Which packages are installed is unknown, and "
            f"the service is STOPPED. {_status_hint(plan.service)} once the host answers; "
            f"restore the snapshot with {by_hand}.", before, None)
    if verdict == "failed":
        return HostOutcome(HostStatus.FAILED, f"{cause}; {why}. The service is STOPPED; "
                           f"restore the snapshot with {by_hand}.", before, None)
    err = yield from _start_and_gate(svc, Step.ROLLBACK_START, Step.ROLLBACK_HEALTH)
    if err is not None:
        left = yield from _left_as(svc, Step.ROLLBACK_HEALTH, err)
        return HostOutcome(HostStatus.FAILED, f"{cause}; rolled back to {before} but {err}. "
                           f"{left}", before, None)
    after, differs = yield from _postcheck_restored(svc, host, env)
    if differs is not None:
        return HostOutcome(HostStatus.FAILED, f"{cause}; rolled back and healthy on {after}, "
                           f"but {differs}", before, after)
    return HostOutcome(HostStatus.ROLLED_BACK, f"{cause}; rolled back to {after} (the whole "
                       f"environment, {env.freeze.count} packages, as before), healthy",
                       before, after)


def restart_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Stop, drain, start, health: the same gates as a redeploy without the reinstall."""
    yield Emit(BeginStep(Step.PREFLIGHT, cmd(remote.unit_show(svc))))
    try:
        props = yield from _preflight_unit(svc, host)
    except _Refused as e:
        yield Emit(EndStep(Step.PREFLIGHT, False, e.reason))
        return HostOutcome(HostStatus.ABORTED, f"preflight refused; service untouched: {e.reason}")
    before = yield from _version(Step.PREFLIGHT, svc)
    yield Emit(Versions(before, None))
    yield Emit(EndStep(Step.PREFLIGHT, True,
                       f"{svc.unit} {props.get('ActiveState', '?')}, {svc.package} {before}"))
    check = yield from _gpu_check(svc, host, plan.is_local(host))
    if check.refusal is not None:
        return HostOutcome(HostStatus.ABORTED,
                           f"preflight refused; service untouched: {check.refusal}", before, None)
    if (ended := (yield from _cancelled_before_change(before))) is not None:
        return ended
    if (ended := (yield from _quiesce_and_stop(plan, svc, before))) is not None:
        return ended
    drain, reason = yield from _drain_clean(svc, host)
    if drain == "failed":
        return HostOutcome(HostStatus.FAILED, f"{reason}. The service is STOPPED; free the GPUs, "
                           "then restart it.", before, None)
    err = yield from _start_and_gate(svc, Step.START, Step.HEALTH)
    if err is not None:
        left = yield from _left_as(svc, Step.HEALTH, err)
        return HostOutcome(HostStatus.FAILED, f"{err}. {left}", before, None)
    after = yield from _postcheck(svc, host)
    status = HostStatus.CANCELLED if drain == "cancelled" else HostStatus.SUCCEEDED
    return (yield from _gpu_recheck(svc, host, check, HostOutcome(
        status, f"restarted on {after}, healthy", before, after), plan.is_local(host)))


def status_flow(plan: Plan, svc: ServiceSettings, host: str) -> Flow:
    """Unit state, installed version and the GPU table; changes nothing."""
    yield Emit(BeginStep(Step.STATUS, plan.steps[0].command))
    r, props = yield from _unit_state(Step.STATUS, svc)
    version = yield from _version(Step.STATUS, svc)
    yield Emit(Versions(version, None))
    state = (f"{props.get('ActiveState', '?')} ({props.get('SubState', '?')}), "
             f"MainPID {props.get('MainPID', '?')}") if r.ok else f"unknown ({_why(r)})"
    api = yield from _serving(svc, props)
    try:
        snap = yield from _snapshot(Step.STATUS, svc, host)
    except GpuQueryError as e:
        summary = f"{svc.unit}: {state}; {svc.package} {version}; {api}; GPUs: {e.reason}"
        yield Emit(EndStep(Step.STATUS, False, summary, e.exit_status))
        return HostOutcome(HostStatus.FAILED, summary, version, version)
    yield Emit(Snapshot("now", snap))
    summary = (f"{svc.unit}: {state}; {svc.package} {version}; {api}; "
               f"{memory_summary(snap, 'GPU memory')}")
    yield Emit(EndStep(Step.STATUS, True, summary))
    return HostOutcome(HostStatus.SUCCEEDED, summary, version, version)


FLOWS: dict[RunAction, Callable[[Plan, ServiceSettings, str], Flow]] = {
    RunAction.REDEPLOY: redeploy_flow, RunAction.RESTART: restart_flow,
    RunAction.STATUS: status_flow}
