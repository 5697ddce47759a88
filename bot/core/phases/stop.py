"""Before the reinstall: the in-flight requests are waited for, the unit is stopped and
its GPU memory drained."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from bot.core import remote
from bot.core.gpu import DrainVerdict, GpuSnapshot, drain_verdict, parse_pgrep
from bot.core.metrics import Load, MetricsError, parse_load
from bot.core.phases.actions import (
    BeginStep,
    Emit,
    EndStep,
    HostOutcome,
    Phase,
    Progress,
    Sleep,
    Snapshot,
    http,
    pause,
    run,
)
from bot.core.phases.common import (
    HEALTH_REQUEST_TIMEOUT_S,
    DrainEnd,
    HostLost,
    check_reached,
    failed_msg,
    http_why,
    lost,
    read_snapshot,
    reason_of,
    service_workers,
    status_hint,
    tail_of,
)
from bot.core.plan import Plan, Step, cmd, requests_command
from bot.core.readiness import metrics_url
from bot.core.service_state import ServiceState
from bot.core.status import HostStatus
from bot.errors import GpuQueryError
from bot.settings import ServiceSettings


def _stop(
    svc: ServiceSettings, service: str, untouched: ServiceState
) -> Phase[tuple[str, ServiceState] | None]:
    """systemctl stop. None when stopped, else the run's summary and how the service is
    (``untouched``: as preflight read it, for a stop that never ran)."""
    argv = remote.unit_stop(svc)
    yield Emit(BeginStep(Step.STOP, cmd(argv)))
    r = yield from run(Step.STOP, argv, svc.stop_timeout_s)
    if lost(r):
        # systemd goes on with a stop job whose client went away, if it ever got it.
        msg = f"connection lost during systemctl stop ({reason_of(r)})"
        yield Emit(EndStep(Step.STOP, False, msg, None, tail_of(r.output)))
        return (
            f"{msg}: the service may be running, stopping or stopped. {status_hint(service)}."
        ), ServiceState.UNKNOWN
    if not r.ok:
        msg = failed_msg("systemctl stop", r, svc.stop_timeout_s)
        yield Emit(EndStep(Step.STOP, False, msg, r.exit_status, tail_of(r.output)))
        if r.refused is not None:
            return f"{msg}. The stop never ran: the service was not touched", untouched
        return f"{msg}; the service may still be running", ServiceState.UNKNOWN
    yield Emit(EndStep(Step.STOP, True, f"{svc.unit} stopped", r.exit_status))
    return None


def drain_poll(svc: ServiceSettings, host: str) -> Phase[tuple[GpuSnapshot, DrainVerdict]]:
    """One look at GPU memory, compute apps and surviving workers."""
    snap = yield from read_snapshot(Step.DRAIN, svc, host)
    w = yield from run(Step.DRAIN, remote.workers_query(), svc.command_timeout_s, quiet=True)
    check_reached(host, w)
    # pgrep exits 1 when nothing matches; anything else means we could not tell.
    if w.exit_status not in (0, 1):
        raise GpuQueryError(
            host,
            f"cannot list vLLM workers ({reason_of(w)})",
            exit_status=w.exit_status,
            output=w.output,
        )
    workers = yield from service_workers(svc, host, snap, parse_pgrep(w.stdout, host))
    return snap, drain_verdict(snap, svc.drain_threshold_mib, workers)


def drain_gpus(svc: ServiceSettings, host: str) -> Phase[tuple[DrainEnd, str | None]]:
    """Poll until GPU memory is released. Returns how it ended and why.

    A poll whose result never came back is no verdict: the next poll reconnects,
    and only the drain timeout ends the wait."""
    yield Emit(
        BeginStep(
            Step.DRAIN,
            f"poll {cmd(remote.gpu_query())}, "
            f"{cmd(remote.apps_query())}, {cmd(remote.workers_query())}",
        )
    )
    start = (yield from pause(0.0)).now
    polls = 0
    last: tuple[GpuSnapshot, DrainVerdict] | None = None  # the latest poll that was answered
    unreachable: str | None = None  # why the latest poll was not
    while True:
        polls += 1
        try:
            last = yield from drain_poll(svc, host)
            unreachable = None
        except HostLost as e:
            unreachable = e.reason
        except GpuQueryError as e:
            msg = f"cannot tell whether the GPUs are free: {e.reason}"
            yield Emit(EndStep(Step.DRAIN, False, msg, e.exit_status, tail_of(e.output)))
            return "failed", msg
        tick = yield from pause(0.0)
        elapsed = tick.now - start
        drained = unreachable is None and last is not None and last[1].drained
        # A cancel wins over a drain that just ended: once the drain says "ok" the
        # reinstall starts, and a cancel can then only take effect after it.
        if tick.cancel_requested:
            if last is not None:
                yield Emit(Snapshot("drain cancelled", last[0]))
            yield Emit(
                EndStep(
                    Step.DRAIN,
                    False,
                    "cancelled once the GPU memory was released"
                    if drained
                    else "cancelled while waiting for GPU memory",
                )
            )
            return "cancelled", None
        if drained and last is not None:
            yield Emit(Snapshot("after drain", last[0]))
            yield Emit(
                EndStep(
                    Step.DRAIN, True, f"GPU memory released after {elapsed:.1f}s ({polls} polls)"
                )
            )
            return "ok", None
        if elapsed >= svc.drain_timeout_s:
            if unreachable is not None or last is None:
                msg = (
                    f"no answer from the host while waiting for GPU memory ({unreachable}); "
                    f"could not confirm within {svc.drain_timeout_s:g}s that it was released"
                )
                yield Emit(EndStep(Step.DRAIN, False, msg))
                return "failed", msg
            yield Emit(Snapshot("drain timeout", last[0]))
            msg = f"GPU memory still held after {svc.drain_timeout_s:g}s: {last[1].describe()}"
            yield Emit(EndStep(Step.DRAIN, False, msg, None, last[1].describe()))
            return "failed", msg
        yield Sleep(svc.drain_poll_s)


# Reads of /metrics that got no answer (a lost connection, a timeout, a 5xx) before the
# load counts as unknown. A server that answered otherwise (404, not Prometheus text, no
# request gauges) is unknown at once: reading again would say the same.
UNKNOWN_LOAD_READS = 3


@dataclass(frozen=True, slots=True)
class _LoadRead:
    load: Load | None
    why: str  # when the load is None: why it is unknown
    final: bool  # reading again would say the same


def _read_load_once(svc: ServiceSettings) -> Phase[_LoadRead]:
    url = metrics_url(svc)
    h = yield from http(url, HEALTH_REQUEST_TIMEOUT_S)
    if not h.ok:
        return _LoadRead(
            None,
            f"{url} did not answer with metrics ({http_why(h)})",
            h.status is not None and h.status < 500,
        )
    try:
        load = parse_load(h.body, truncated=h.truncated)
    except MetricsError as e:
        return _LoadRead(None, f"{url}: {e}", True)
    if not load.known:
        # A server started with --disable-log-stats, or an empty body (vllm#8612).
        return _LoadRead(None, f"{url} has no {load.missing()}", True)
    return _LoadRead(load, "", True)


def read_load(svc: ServiceSettings) -> Phase[tuple[Load | None, str]]:
    """The server's load from /metrics, or None and why it is unknown."""
    read = yield from _read_load_once(svc)
    return read.load, read.why


def _requests_verdict(
    plan: Plan, svc: ServiceSettings, load: Load, first: Load, elapsed: float
) -> tuple[bool, str] | None:
    """Whether to stop now (True) or give up (False), and the step's summary; None to
    wait on."""
    if load.idle:
        return True, (
            "no request in flight"
            if first.idle
            else f"in-flight requests finished after {elapsed:.1f}s (there were {first.describe()})"
        )
    if plan.force:
        return True, f"--force: stopping with {load.describe()}, which are interrupted"
    if svc.request_drain_timeout_s == 0:
        return True, (
            f"not waiting (request_drain_timeout_s = 0): {load.describe()} are interrupted"
        )
    if elapsed >= svc.request_drain_timeout_s:
        return False, f"{load.describe()} still in flight after {svc.request_drain_timeout_s:g}s"
    return None


def cancelled_before_change(
    before: str | None, untouched: ServiceState
) -> Phase[HostOutcome | None]:
    """A cancel point before the first change: the outcome that ends the run, or None."""
    if (yield from pause()).cancel_requested:
        return HostOutcome(
            HostStatus.CANCELLED, "cancelled before anything was changed", untouched, before, None
        )
    return None


def quiesce_and_stop(
    plan: Plan, svc: ServiceSettings, before: str | None, untouched: ServiceState
) -> Phase[HostOutcome | None]:
    """Wait for in-flight requests (``--force``: not), then stop the unit. None once it
    is stopped; else the outcome that ends the run (``untouched``: the service's state
    as preflight read it, where the run ends before the stop)."""
    held = yield from _drain_requests(plan, svc, before, untouched)
    if held is not None:
        return held
    failure = yield from _stop(svc, plan.service, untouched)
    if failure is not None:
        summary, state = failure
        return HostOutcome(HostStatus.FAILED, summary, state, before, None)
    return None


def _drain_requests(
    plan: Plan, svc: ServiceSettings, before: str | None, untouched: ServiceState
) -> Phase[HostOutcome | None]:
    """Before the stop: wait until no request runs or waits on the server (vLLM aborts
    them at a stop), showing the counts live. None to go on with the stop; else the
    run's outcome, with the service untouched. A load that cannot be read is not idle
    (``_unknown_load``)."""
    yield Emit(BeginStep(Step.REQUESTS, requests_command(svc)))
    start = (yield from pause(0.0)).now
    first: Load | None = None
    seen: deque[str] = deque(maxlen=50)  # each change of the counts, for the record
    unanswered = 0
    while True:
        read = yield from _read_load_once(svc)
        elapsed = (yield from pause(0.0)).now - start
        load = read.load
        if load is None:
            unanswered += 1
            if read.final or unanswered >= UNKNOWN_LOAD_READS or not _waits(plan, svc):
                return (yield from _unknown_load(plan, svc, before, untouched, read.why, seen))
            yield Progress(Step.REQUESTS, f"load unknown ({read.why}); reading again", elapsed)
        else:
            unanswered = 0
            first = first or load
            if not seen or not seen[-1].endswith(load.describe()):
                seen.append(f"{elapsed:7.1f}s  {load.describe()}")
            yield Progress(Step.REQUESTS, load.describe(), elapsed)
            verdict = _requests_verdict(plan, svc, load, first, elapsed)
            if verdict is not None:
                return (yield from _requests_end(before, untouched, verdict, seen))
        if (yield from pause(svc.drain_poll_s)).cancel_requested:
            now = load.describe() if load is not None else "load unknown"
            yield Emit(
                EndStep(
                    Step.REQUESTS, False, f"cancelled while waiting for in-flight requests ({now})"
                )
            )
            return HostOutcome(
                HostStatus.CANCELLED,
                "cancelled while waiting for in-flight requests; nothing was changed",
                untouched,
                before,
                None,
            )


def _waits(plan: Plan, svc: ServiceSettings) -> bool:
    """Whether the stop waits for requests at all (not with --force or a zero timeout)."""
    return not plan.force and svc.request_drain_timeout_s > 0


def _requests_end(
    before: str | None, untouched: ServiceState, verdict: tuple[bool, str], seen: deque[str]
) -> Phase[HostOutcome | None]:
    go, summary = verdict
    yield Emit(EndStep(Step.REQUESTS, go, summary, None, "\n".join([*seen, summary])))
    if go:
        return None
    return HostOutcome(
        HostStatus.ABORTED,
        f"{summary}; service untouched. Try again later, or with --force to interrupt them.",
        untouched,
        before,
        None,
    )


# The unit states in which no server process runs, so no request can be in flight.
_NOT_RUNNING = ("inactive", "failed")


def _unknown_load(
    plan: Plan,
    svc: ServiceSettings,
    before: str | None,
    untouched: ServiceState,
    why: str,
    seen: deque[str],
) -> Phase[HostOutcome | None]:
    """/metrics says nothing of the requests (no answer, no vllm: gauges: a server with
    --disable-log-stats). Unknown is not idle (issue 17, D5): the stop would cut whatever
    runs. It goes on only with --force, with request_drain_timeout_s = 0 (the stop never
    waits for requests then, known or not), or when ``systemctl is-active`` says the unit
    does not run (no process, no request to cut); otherwise the run ends ``aborted``."""
    if plan.force:
        verdict = (
            True,
            (
                f"--force: stopping with the load unknown ({why}); any request in "
                "flight is interrupted"
            ),
        )
    elif svc.request_drain_timeout_s == 0:
        verdict = (
            True,
            (
                f"not waiting (request_drain_timeout_s = 0): the load is unknown "
                f"({why}); any request in flight is interrupted"
            ),
        )
    else:
        r = yield from run(
            Step.REQUESTS, remote.unit_is_active(svc), svc.command_timeout_s, quiet=True
        )
        state = r.stdout.strip() or reason_of(r)
        if state in _NOT_RUNNING:
            verdict = (
                True,
                (
                    f"the load is unknown ({why}), but {svc.unit} is {state}: no "
                    "request to interrupt"
                ),
            )
        else:
            verdict = (
                False,
                (
                    f"the load is unknown: {why}, and {svc.unit} is {state}; pass "
                    "--force to stop anyway"
                ),
            )
    go, summary = verdict
    yield Emit(EndStep(Step.REQUESTS, go, summary, None, "\n".join([*seen, summary])))
    if go:
        return None
    return HostOutcome(
        HostStatus.ABORTED, f"{summary}. Service untouched.", untouched, before, None
    )
