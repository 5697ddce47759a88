"""Runs: plan and execute maintenance jobs.

The one place that ties the pure parts (plan, flows) to the edges (audit log,
host pool, event sinks).  The Slack handlers and the CLI both call this; neither
knows how a run is executed.  Every status change of a run (request, approval,
start, finish, interrupt) goes through ``bot.engine.lifecycle``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from bot.audit.records import parse_ts
from bot.audit.resilient import AuditWriter
from bot.audit.store import AuditLog, RunRecord
from bot.core import events as ev
from bot.core.become import become_for
from bot.core.flows import HostOutcome
from bot.core.plan import Plan, make_plan
from bot.core.plan_drift import drift
from bot.core.service_state import ServiceState, worst
from bot.core.startup import StartHistory
from bot.core.status import Action, HostStatus, RunStatus
from bot.engine.audit_reads import AuditReads
from bot.engine.audit_sink import RunAudit
from bot.engine.executor import CancelToken, Executor
from bot.engine.host_runs import flow_of, host_plan_of, keys_of, reach_of
from bot.engine.leftover_gate import LeftoverGate
from bot.engine.lifecycle import RunLifecycle, lock_scopes, needs_locks
from bot.errors import AuditError, HostError, LockHeldError
from bot.hosts.pool import HostPool
from bot.settings import Settings

# Worst outcome first: the run's status is the worst of its hosts'.
_SEVERITY: tuple[tuple[HostStatus, RunStatus], ...] = (
    (HostStatus.FAILED, RunStatus.FAILED),
    (HostStatus.ROLLED_BACK, RunStatus.ROLLED_BACK),
    (HostStatus.CANCELLED, RunStatus.CANCELLED),
    (HostStatus.ABORTED, RunStatus.ABORTED),
    (HostStatus.SUCCEEDED, RunStatus.SUCCEEDED),
)
# The per-host state of a host a stopped rollout never touched.
NOT_STARTED = HostStatus.NOT_STARTED


def rollout_batches(plan: Plan) -> list[tuple[str, ...]]:
    """The hosts in the order they are worked on: a change goes ``plan.batches()`` one
    after the other; a read-only status asks every host at once."""
    return [plan.hosts] if plan.action.read_only else plan.batches()


def overall_status(outcomes: Sequence[HostOutcome]) -> RunStatus:
    statuses = {HostStatus(o.status) for o in outcomes}
    if HostStatus.ABORTED in statuses and statuses != {HostStatus.ABORTED}:
        # "aborted" promises the service was untouched; another host was changed.
        statuses = (statuses - {HostStatus.ABORTED}) | {HostStatus.FAILED}
    for host_status, run_status in _SEVERITY:
        if host_status in statuses:
            return run_status
    return RunStatus.FAILED


@dataclass
class RunResult:
    run_id: int
    status: RunStatus
    summary: str
    outcomes: dict[str, HostOutcome]
    # Every planned host in plan order: its outcome's status, or NOT_STARTED for a host
    # the rollout never reached (what a status card shows per host).
    host_status: dict[str, HostStatus] = field(default_factory=dict)


def host_states(hosts: Sequence[str], outcomes: Mapping[str, HostOutcome]) -> dict[str, HostStatus]:
    """Each planned host's state, in plan order; NOT_STARTED where there is no outcome."""
    return {h: HostStatus(outcomes[h].status) if h in outcomes else NOT_STARTED for h in hosts}


class Engine:
    """Plan and execute runs. One instance per process, shared by Slack and the CLI;
    their status changes are the ``lifecycle``'s."""

    def __init__(
        self,
        settings: Settings,
        audit: AuditLog,
        pool: HostPool,
        lifecycle: RunLifecycle,
        writer: AuditWriter,
    ) -> None:
        # Both required: a lifecycle built here would hold cancel tokens the front ends'
        # cancels never reach, and a writer built here would not be started (its fallback
        # journal never merged). ``bot.engine.runtime`` builds the process's one of each.
        self.settings = settings
        self.audit = audit
        self.pool = pool
        self.lifecycle = lifecycle
        # A run's audit records: retried, or kept in the fallback journal (audit_sink).
        self.writer = writer
        # Sinks that hear every run this process drives (bot.engine.exporter's).
        self.observers: tuple[ev.EventSink, ...] = ()

    def plan(
        self,
        action: Action,
        service: str,
        *,
        version: str | None = None,
        index: str | None = None,
        dry_run: bool = False,
        batch: int | None = None,
        force: bool = False,
        host: str | None = None,
    ) -> Plan:
        return make_plan(
            self.settings,
            action,
            service,
            version=version,
            index=index,
            dry_run=dry_run,
            batch=batch,
            host_keys=self._host_keys(service),
            force=force,
            host=host,
        )

    def plan_of(self, record: RunRecord) -> Plan:
        # Rebuilt from the current config: the commands always come from the config,
        # never from what was stored.
        p = record.plan
        if Action(record.action).host_wide:
            return host_plan_of(self.settings, record)
        return make_plan(
            self.settings,
            Action(record.action),
            record.service,
            version=p.get("version"),
            index=p.get("index_name"),
            dry_run=bool(p.get("dry_run")),
            batch=p.get("batch_size"),
            host_keys=self._host_keys(record.service),
            force=bool(p.get("force")),
            # drain/undrain: the one host named, as recorded
            host=(p.get("hosts") or [None])[0] if Action(record.action).one_host else None,
        )

    def _host_keys(self, service: str) -> dict[str, str]:
        # Read now, at request and again at execute: a key swapped in known_hosts between
        # the two is a changed plan (bot.core.plan.HostTarget).
        return keys_of(self.settings, service)

    async def execute(
        self, run_id: int, sink: ev.EventSink, gate: LeftoverGate | None = None
    ) -> RunResult:
        """Run an approved run to its end. The run must be in 'approved'. ``gate``: who
        may let it terminate processes that outlived the stop (bot.engine.leftover_gate)."""
        life = self.lifecycle
        record = await self.audit.get_run(run_id)
        plan = self.plan_of(record)
        if self.audit.as_stored(plan.to_json()) != record.plan:
            # The config changed since the card was approved: never run what nobody saw.
            reason = (
                f"the configuration changed since this plan was approved "
                f"({drift(record.plan, self.audit.as_stored(plan.to_json()))}); "
                "request it again to see the new plan"
            )
            await life.refuse(record, reason)
            return RunResult(run_id, RunStatus.REFUSED, f"not started: {reason}", {})
        if needs_locks(plan):
            try:
                # A holder whose driver died is recovered here, as at request time.
                await life.take_locks(run_id, lock_scopes(plan))
            except LockHeldError as exc:
                await life.refuse(record, str(exc))
                raise
        token = await life.start(run_id)
        if token is None:
            current = (await self.audit.get_run(run_id)).status
            if current != RunStatus.RUNNING:
                # Nobody drives it, so the locks just taken must not outlive this call; a
                # 'running' one is driven elsewhere and its locks are not ours to drop.
                await self.audit.release_locks(run_id)
            return RunResult(run_id, current, f"not started: run is {current}", {})
        # The audit record must be written (or kept in the fallback journal, and then the
        # service is brought back: see audit_sink); a broken chat or terminal sink must not
        # stop a half-finished maintenance job.
        notify = ev.BestEffort(sink)
        audit = RunAudit(self.writer, run_id, token, notify)
        # The process's own observers (its metrics) hear every run, best effort too.
        watchers = [ev.BestEffort(o) for o in self.observers]
        try:
            return await self._execute(
                record, plan, ev.FanOut(audit, notify, *watchers), token, audit, gate
            )
        except BaseException:
            # Cancelled (the bot shutting down, a second Ctrl-C) or broken: the record
            # must say so at once, not wait for the next start's recovery.
            await asyncio.shield(audit.interrupt(lambda: life.interrupt(run_id)))
            raise
        finally:
            # Who cancelled is on disk (or in the journal) before this returns; locks go.
            await audit.released(life.released)

    async def _execute(
        self,
        record: RunRecord,
        plan: Plan,
        sink: ev.EventSink,
        token: CancelToken,
        audit: RunAudit,
        gate: LeftoverGate | None = None,
    ) -> RunResult:
        run_id = record.id
        # A run approved for later waited on purpose: its hours are no approval wait.
        waited = (
            (self.lifecycle.clock() - parse_ts(record.created_at)).total_seconds()
            if record.scheduled_at is None
            else None
        )
        await sink.handle(
            ev.RunStarted(run_id, plan, record.requested_by, tuple(record.approved_by), waited)
        )
        flow = flow_of(self.settings, plan)
        outcomes: dict[str, HostOutcome] = {}
        history = await self._start_history(plan)

        async def one(host: str) -> HostOutcome:
            try:
                executor = Executor(
                    run_id,
                    self.pool.get(host),
                    sink,
                    cancel=token,
                    gate=gate,
                    ask_timeout_s=self.settings.policy.approval_ttl_s,
                    history=history,
                    become=become_for(self.settings, host, plan.service),
                    gpu_health=self.pool.gpu_health(host),
                    reach=reach_of(self.settings, self.pool, plan),
                    reads=AuditReads(self.audit),
                )
                return await executor.drive(flow(host))
            except (HostError, OSError) as e:
                # The executor turns host errors into failed steps; this is what escapes
                # it (a host missing from the pool, a dead socket outside a command).
                reason = e.reason if isinstance(e, HostError) else str(e)
                outcome = HostOutcome(HostStatus.FAILED, reason, ServiceState.UNKNOWN)
                await sink.handle(
                    ev.HostFinished(run_id, host, outcome.status, outcome.summary, outcome.state)
                )
                return outcome

        for batch in rollout_batches(plan):
            # A batch runs to its end even when one of its hosts fails: cutting a
            # sibling's redeploy in half would leave it in a worse state.
            results = await asyncio.gather(*map(one, batch), return_exceptions=True)
            for host, res in zip(batch, results, strict=True):
                if isinstance(res, BaseException):
                    raise res  # a bug, not a host problem; raised once the batch is done
                outcomes[host] = res
            if any(o.status != HostStatus.SUCCEEDED for o in outcomes.values()):
                break  # the first failure stops the rollout; later hosts stay untouched
        return await self._finish(run_id, plan, sink, audit, outcomes)

    async def _finish(
        self,
        run_id: int,
        plan: Plan,
        sink: ev.EventSink,
        audit: RunAudit,
        outcomes: dict[str, HostOutcome],
    ) -> RunResult:
        """The run's end from its hosts' outcomes: the hosts it never reached, its status,
        summary and service state, recorded before the sinks hear of it."""
        untouched = [h for h in plan.hosts if h not in outcomes]
        for host in untouched:
            await sink.handle(
                ev.HostFinished(
                    run_id,
                    host,
                    NOT_STARTED,
                    "not started: the rollout stopped before it",
                    ServiceState.UNKNOWN,
                )
            )
        status = overall_status(list(outcomes.values()))
        summary = self._summary(plan, outcomes, untouched)
        first = outcomes.get(plan.hosts[0])
        await audit.set_versions(
            before=first.version_before if first else None,
            after=first.version_after if first else None,
        )
        # The hosts it ran on: those the rollout never reached it left as they were.
        state = worst(o.state for o in outcomes.values())
        await audit.finish(
            status, summary, lambda: self.lifecycle.finish(run_id, status, summary), state=state
        )
        await sink.handle(
            ev.RunFinished(
                run_id,
                status,
                summary,
                first.version_before if first else None,
                first.version_after if first else None,
                state,
            )
        )
        return RunResult(run_id, status, summary, outcomes, host_states(plan.hosts, outcomes))

    async def _start_history(self, plan: Plan) -> StartHistory | None:
        """This service's previous start times, for the progress of this run's starts;
        a database that cannot answer now costs only the estimate."""
        if plan.action.read_only or plan.action.one_host or plan.action.host_wide:
            return None
        try:
            return await self.audit.start_history(plan.service)
        except AuditError:
            return None

    @staticmethod
    def _summary(plan: Plan, outcomes: dict[str, HostOutcome], untouched: list[str]) -> str:
        if len(plan.hosts) == 1 and outcomes:
            return next(iter(outcomes.values())).summary
        # Problems first, each with its reason; hosts that succeeded alike share a line,
        # so a 64-host rollout's summary stays short.
        parts = [
            f"{h}: {o.status} ({o.summary})"
            for h, o in outcomes.items()
            if o.status != HostStatus.SUCCEEDED
        ]
        alike: dict[str, list[str]] = {}
        for h, o in outcomes.items():
            if o.status == HostStatus.SUCCEEDED:
                alike.setdefault(o.summary, []).append(h)
        parts += [f"succeeded ({s}): {', '.join(hosts)}" for s, hosts in alike.items()]
        if untouched:
            parts.append(f"not started: {', '.join(untouched)}")
        return "; ".join(parts)
