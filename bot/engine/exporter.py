"""The bot's own Prometheus metrics (issue 22): what it did, from the events of the runs
this process drives, and what every replica shares, read from the audit database at
each scrape. ``prometheus_client`` writes the exposition; nothing here formats it.

Names follow Prometheus' conventions: the ``vllm_chatops_`` prefix, seconds, ``_total``
on counters (``prometheus_client`` adds it), and no user IDs as labels (a label per
person would grow without bound and put names where anyone scraping can read them).
Counters count from this process's start, as Prometheus expects of a counter; the
gauges of shared state (runs waiting or running, locks, the last successful redeploy)
come from the database, so they survive a restart and agree across replicas.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import assert_never

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.exposition import generate_latest

from bot.audit.records import parse_ts
from bot.audit.store import AuditLog
from bot.core import events as ev
from bot.core.health_types import Level
from bot.core.plan import Step
from bot.core.status import ACTIVE_STATUSES, HostStatus, StepStatus
from bot.engine.run_results import Refusal
from bot.errors import AuditError

# The steps whose success means the service answers again: the outage ends at the last
# of them a host passes (readiness after health, when it is configured).
_SERVING = frozenset({Step.HEALTH, Step.READINESS, Step.ROLLBACK_HEALTH, Step.ROLLBACK_READINESS})
# A redeploy's steps last from under a second to an hour (an install); a run to hours.
_STEP_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
_RUN_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400)
_WAIT_BUCKETS = (5, 15, 30, 60, 120, 300, 600, 900, 1800, 3600)
_LEVEL_VALUE = {Level.OK: 0, Level.WARN: 1, Level.CRITICAL: 2}


def _build_version() -> str:
    try:
        return metadata.version("vllm-chatops")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(slots=True)
class _Run:
    action: str
    service: str
    started: float
    stops: dict[str, float]  # host -> when its stop began
    served: dict[str, float]  # host -> when it last passed a serving step


class Exporter:
    """One per process (``bot.engine.runtime``). It is a sink the engine attaches to every
    run it drives; ``refused`` is called with each refusal's reason code; ``scrape``
    reads the shared state and returns the exposition."""

    def __init__(self, *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._now = monotonic
        self.registry = r = CollectorRegistry()
        self.runs = Counter(
            "vllm_chatops_runs",
            "Runs that ended, by action, service and final status.",
            ["action", "service", "status"],
            registry=r,
        )
        self.run_seconds = Histogram(
            "vllm_chatops_run_duration_seconds",
            "From a run's start to its end.",
            ["action"],
            buckets=_RUN_BUCKETS,
            registry=r,
        )
        self.step_seconds = Histogram(
            "vllm_chatops_step_duration_seconds",
            "Each step's duration, by action and step.",
            ["action", "step"],
            buckets=_STEP_BUCKETS,
            registry=r,
        )
        self.outage_seconds = Histogram(
            "vllm_chatops_outage_seconds",
            "From the stop's start until the service served again, per host.",
            ["service"],
            buckets=_RUN_BUCKETS,
            registry=r,
        )
        self.approval_wait = Histogram(
            "vllm_chatops_approval_wait_seconds",
            "From a request until its run started (approvals included).",
            ["action"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self._define_state(r)
        # The runs this process drives now: bounded by the locks (one per service).
        self._runs: dict[int, _Run] = {}

    def _define_state(self, r: CollectorRegistry) -> None:
        """What is counted beside the runs' own timings, and the shared state's gauges."""
        self.rollbacks = Counter(
            "vllm_chatops_rollbacks",
            "Hosts a run rolled back to the previous version.",
            ["service"],
            registry=r,
        )
        self.refusals = Counter(
            "vllm_chatops_refusals",
            "Refused requests and clicks, by reason.",
            ["reason"],
            registry=r,
        )
        self.in_flight = Gauge(
            "vllm_chatops_runs_in_flight",
            "Runs not yet ended (every replica's), by status.",
            ["status"],
            registry=r,
        )
        self.locks = Gauge("vllm_chatops_locks_held", "Lock scopes held by runs.", registry=r)
        self.last_success = Gauge(
            "vllm_chatops_last_successful_redeploy_timestamp_seconds",
            "When each service's last successful redeploy ended (Unix time).",
            ["service"],
            registry=r,
        )
        self.deployed = Info(
            "vllm_chatops_deployed",
            "The version each service's last successful redeploy left.",
            ["service"],
            registry=r,
        )
        self.gpu_health = Gauge(
            "vllm_chatops_gpu_health_level",
            "Each GPU's health at its host's last read: 0 ok, 1 warn, 2 critical.",
            ["host", "gpu"],
            registry=r,
        )
        self.journal_records = Gauge(
            "vllm_chatops_audit_journal_records",
            "Audit records held in the fallback journal, not yet in the database.",
            registry=r,
        )
        self.audit_up = Gauge(
            "vllm_chatops_audit_database_up",
            "1 when this scrape could read the audit database, else 0.",
            registry=r,
        )
        Info("vllm_chatops_build", "The bot's build.", registry=r).info(
            {"version": _build_version()}
        )

    async def handle(self, event: ev.Event) -> None:
        """An event sink: the engine hands it every event of the runs it drives."""
        self._event(event)

    def refused(self, code: Refusal) -> None:
        self.refusals.labels(reason=str(code)).inc()

    async def scrape(self, audit: AuditLog, journal_records: int) -> bytes:
        """The exposition, after reading what every replica shares from ``audit``. A
        database that cannot be read leaves those gauges as last read and says so
        (``vllm_chatops_audit_database_up`` 0): the counters are still worth a scrape."""
        self.journal_records.set(journal_records)
        try:
            reads = await audit.metrics_reads()
        except (AuditError, OSError):
            # Down, locked past the busy timeout, restarting (PostgreSQL), or closed.
            self.audit_up.set(0)
            return generate_latest(self.registry)
        self.audit_up.set(1)
        for status in ACTIVE_STATUSES:
            self.in_flight.labels(status=str(status)).set(reads.runs_by_status.get(status, 0))
        self.locks.set(reads.locks_held)
        for last in reads.last_success:
            self.last_success.labels(service=last.service).set(
                parse_ts(last.finished_at).timestamp()
            )
            self.deployed.labels(service=last.service).info({"version": last.version or ""})
        return generate_latest(self.registry)

    # ---- what the sink calls ---------------------------------------------------------

    def _event(self, event: ev.Event) -> None:
        match event:
            case ev.OutputLine():
                return  # first: most of a run's events, nothing to count
            case ev.RunStarted():
                self._run_started(event)
            case ev.StepStarted():
                run = self._runs.get(event.run_id)
                if run is not None and event.step == Step.STOP:
                    run.stops.setdefault(event.host, self._now())
            case ev.StepFinished():
                self._step_finished(event)
            case ev.HostFinished():
                self._host_finished(event)
            case ev.RunFinished():
                self._run_finished(event)
            case ev.GpuHealthKnown():
                health = event.check.health
                for gpu in health.gpus if health is not None else ():
                    gpu_id = gpu.label.removeprefix("GPU ")
                    self.gpu_health.labels(host=event.host, gpu=gpu_id).set(_LEVEL_VALUE[gpu.level])
            case (
                ev.StepProgress()
                | ev.GpuTable()
                | ev.VersionsKnown()
                | ev.PackagesKnown()
                | ev.RotationChanged()
                | ev.ReleaseSwitched()
                | ev.Notice()
            ):
                pass  # nothing to count
            case _:
                assert_never(event)

    def _run_started(self, event: ev.RunStarted) -> None:
        action = str(event.plan.action)
        self._runs[event.run_id] = _Run(action, event.plan.service, self._now(), {}, {})
        if event.waited_s is not None:
            self.approval_wait.labels(action=action).observe(max(0.0, event.waited_s))

    def _step_finished(self, event: ev.StepFinished) -> None:
        run = self._runs.get(event.run_id)
        if run is None:
            return
        self.step_seconds.labels(action=run.action, step=str(event.step)).observe(event.duration_s)
        if event.step in _SERVING and event.status == StepStatus.OK:
            run.served[event.host] = self._now()

    def _host_finished(self, event: ev.HostFinished) -> None:
        run = self._runs.get(event.run_id)
        if run is None:
            return
        if event.status == HostStatus.ROLLED_BACK:
            self.rollbacks.labels(service=run.service).inc()
        stopped, served = run.stops.get(event.host), run.served.get(event.host)
        # Only an outage that ended: a host left down has no end to measure yet.
        if stopped is not None and served is not None and served >= stopped:
            self.outage_seconds.labels(service=run.service).observe(served - stopped)

    def _run_finished(self, event: ev.RunFinished) -> None:
        run = self._runs.pop(event.run_id, None)
        if run is None:
            return
        self.runs.labels(action=run.action, service=run.service, status=str(event.status)).inc()
        self.run_seconds.labels(action=run.action).observe(self._now() - run.started)
