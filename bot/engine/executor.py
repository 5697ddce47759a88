"""Drive a pure flow (bot.core.flows) against a host and turn its notices into events.

This is the only place where the sequence meets I/O: each action is performed
over the ``HostTransport`` and its outcome sent back into the generator.  Host
errors (unreachable, connection lost) become results with neither an exit
status nor a signal, which the flow reads as "the result never came back"
(``bot.core.flows.lost``) and handles per step: the drain keeps polling, a cut
reinstall waits for uv to end before anything else touches the venv.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol, assert_never

from bot.core import events as ev
from bot.core.become import Become
from bot.core.flows import (
    Action,
    BeginStep,
    Checkpoint,
    Emit,
    EndStep,
    Flow,
    Health,
    HostOutcome,
    HttpCheck,
    Notice,
    Packages,
    Progress,
    ReadGpuState,
    Reply,
    RotationChange,
    RunCommand,
    Sleep,
    Snapshot,
    Tick,
    Versions,
)
from bot.core.health import GpuStateRead
from bot.core.leftovers import AskApproval
from bot.core.phases.actions import (
    AskSudo,
    DeepStateRead,
    ReadDeepState,
    ReadRotationRecords,
    ReadSwitchHistory,
    ReleaseSwitch,
    SudoAnswer,
)
from bot.core.plan import Step
from bot.core.privilege import Privilege, sudo_refusal
from bot.core.startup import StartHistory
from bot.core.status import HealthSource, StepStatus
from bot.engine.audit_reads import AuditReads
from bot.engine.leftover_gate import LeftoverGate, LeftoverRequest, NoGate, ask_bounded
from bot.errors import FencedError, GpuQueryError, HostError, HostKeyError
from bot.hosts.base import (
    CommandResult,
    HostTransport,
    HttpResult,
    LineCallback,
    Stream,
    cut_line,
)
from bot.hosts.nvml import LocalGpuHealth

# How the executor reaches another configured host: its transport, and how it runs
# commands with rights there (its own ``become``).
Reach = Callable[[str], tuple[HostTransport, Become | None]]

# The step output kept for the audit row and the thread reply; the full stream
# goes to the sinks line by line.
TAIL_LINES = 200


class RunLease(Protocol):
    """Whether the run is still this process's to act on (``bot.engine.heartbeat``)."""

    async def holds(self) -> bool: ...


@dataclass
class CancelToken:
    """Set by a cancel request; the flow reads it only at its safe points.

    Issue 21: it is also what this process holds of the run it drives: ``epoch``, the
    fencing token it took the run at (its audit writes check it, ``bot.audit.fence``),
    and ``lease``, asked before each action on a host (None: nothing to ask, a run
    driven without a heartbeat, as in the tests of a flow)."""

    requested_by: str | None = None
    event: asyncio.Event = field(default_factory=asyncio.Event)
    epoch: int | None = None
    lease: RunLease | None = None

    def request(self, user: str) -> None:
        self.requested_by = user
        self.event.set()

    @property
    def requested(self) -> bool:
        return self.event.is_set()

    async def sleep(self, seconds: float) -> None:
        """A flow's wait: woken early by a cancel request, so a poll does not wait out its
        interval; once cancelled, the polls that bring the service back (the health gate)
        or let an install finish keep their pace rather than spin."""
        if seconds > 0 and not self.requested:
            try:
                await asyncio.wait_for(self.event.wait(), seconds)
            except TimeoutError:
                pass
        elif seconds > 0:
            await asyncio.sleep(seconds)


async def run_command(
    transport: HostTransport,
    become: Become | None,
    argv: tuple[str, ...],
    run_as: Privilege,
    *,
    timeout_s: float,
    on_line: LineCallback | None = None,
    stdin: bytes | None = None,
) -> CommandResult:
    """Run ``argv`` on the host as ``run_as`` needs (``become``: the host's sudo prefix,
    or None to run it as it is).  A sudo refusal comes back with ``refused`` set, naming
    the rule the host lacks: the command never ran.  Every command with rights goes
    through here (the executor, ``/vllm logs``, ``doctor``)."""
    wrapped = argv if become is None else become.argv(argv, run_as)
    result = await transport.run(wrapped, timeout_s=timeout_s, on_line=on_line, stdin=stdin)
    refused = (
        None if become is None else become.refused(argv, run_as, result.exit_status, result.stderr)
    )
    return result if refused is None else replace(result, refused=refused)


async def ask_sudo(
    transport: HostTransport,
    become: Become | None,
    argv: tuple[str, ...],
    run_as: Privilege,
    *,
    timeout_s: float,
) -> SudoAnswer:
    """Whether sudo would run ``argv`` as ``run_as`` needs, asked with ``sudo -n -l`` as
    the login (``Become.question``, the question ``doctor`` asks): nothing is run. Where
    it would not, the answer names the rule the host lacks, as a refusal at run time
    does (``Become.missing_rule``)."""
    question = None if become is None else become.question(argv, run_as)
    if become is None or question is None:
        return SudoAnswer(asked=False)
    try:
        r = await transport.run(question, timeout_s=timeout_s)
    except HostError as e:
        return SudoAnswer(lost=e.reason)
    if r.exit_status is None:
        return SudoAnswer(lost=" ".join(r.stderr.split())[:200] or "no answer")
    if r.exit_status == 0:
        return SudoAnswer()
    # A rule that does not match: sudo -l exits 1 and says nothing (sudo 1.9.13p3).
    why = sudo_refusal(r.exit_status, r.stderr) or "no rule of the login's allows it"
    return SudoAnswer(refused=why, rule=become.missing_rule(argv, run_as))


class Executor:
    def __init__(
        self,
        run_id: int,
        transport: HostTransport,
        sink: ev.EventSink,
        *,
        cancel: CancelToken | None = None,
        clock: Callable[[], float] = time.monotonic,
        gate: LeftoverGate | None = None,
        ask_timeout_s: float = 900.0,
        history: StartHistory | None = None,
        become: Become | None = None,
        gpu_health: LocalGpuHealth | None = None,
        reach: Reach | None = None,
        reads: AuditReads | None = None,
    ) -> None:
        self.run_id = run_id
        # What the flow may ask of the audit log (rotation records, release switches).
        self.reads = reads if reads is not None else AuditReads()
        # Other configured hosts an action may name (``on``): a router's host, a sibling
        # replica whose readiness a rotation checks. None: the flow's host only.
        self.reach = reach
        # NVML's reads of the GPUs' state where the bot runs on the host; None: the host
        # is remote, and ``nvidia-smi -q`` reads them.
        self.gpu_health = gpu_health
        # How this host runs a command that needs an account (sudo, or as it is).
        self.become = become
        # This service's previous start times: a start-up wait's progress shows their median.
        self.history = history
        # Who may let the run terminate leftover processes, and how long it waits for them.
        self.gate: LeftoverGate = gate if gate is not None else NoGate()
        self.ask_timeout_s = ask_timeout_s
        self.transport = transport
        self.sink = sink
        self.cancel = cancel or CancelToken()
        self.clock = clock
        self._step_started = 0.0
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._lines: asyncio.Queue[ev.OutputLine | None] = asyncio.Queue()
        # The events of the flow's notices since its last other action: see ``drive``.
        self._held: list[ev.Event] = []

    @property
    def host(self) -> str:
        return self.transport.host

    async def drive(self, flow: Flow) -> HostOutcome:
        """Perform the flow's actions in turn. Its notices (``Emit``) are turned into events
        at once but delivered together just before its next other action (a command, an
        HTTP check, a wait, a checkpoint, a question) or its end: a step's end, what the
        step found and the next step's start then reach the audit log as one transaction,
        still on disk before that action runs, and before any other sink hears of them. A
        wait's or a checkpoint's reply says whether the run is cancelled, so a cancel that
        an audit write falling to the journal set off is seen there, as before."""
        reply: Reply = None
        try:
            while True:
                action = flow.send(reply)
                if not isinstance(action, Emit):
                    await self._deliver()
                    await self._still_ours()
                reply = await self._perform(action)
        except StopIteration as stop:
            outcome: HostOutcome = stop.value
        except BaseException:
            await self._deliver()  # what the flow told before it broke is still recorded
            raise
        self._held.append(
            ev.HostFinished(self.run_id, self.host, outcome.status, outcome.summary, outcome.state)
        )
        await self._deliver()
        return outcome

    async def _still_ours(self) -> None:
        """Before any action on a host: the run must still be this process's (issue 21).
        One that was paused past its lease while another replica recovered the run
        stops here, having done nothing, rather than act as an owner it no longer is."""
        lease = self.cancel.lease
        if lease is not None and not await lease.holds():
            raise FencedError(
                f"run #{self.run_id} on {self.host}: this process lost the run's lease "
                "(another replica recovered it); it stops driving and acts on no host"
            )

    async def _deliver(self) -> None:
        events, self._held = self._held, []
        if events:
            await ev.deliver_all(self.sink, events)

    async def _perform(self, action: Action) -> Reply:
        # Exhaustive: an action added to ``Action`` and not handled here fails mypy.
        match action:
            case RunCommand():
                return await self._run(action)
            case HttpCheck():
                return await self._http(action)
            case ReadGpuState():
                return await self._gpu_state(action)
            case ReadDeepState():
                return await self._deep_state()
            case AskApproval():
                return await ask_bounded(
                    self.gate,
                    LeftoverRequest(self.run_id, self.host, action.question, action.pids),
                    timeout_s=self.ask_timeout_s,
                    cancelled=self.cancel.event,
                )
            case Sleep():
                await self.cancel.sleep(action.seconds)
                return Tick(self.clock(), self.cancel.requested)
            case Checkpoint():
                return Tick(self.clock(), self.cancel.requested)
            case AskSudo():
                transport, become = self._where(None)
                return await ask_sudo(
                    transport, become, action.argv, action.run_as, timeout_s=action.timeout_s
                )
            case ReadRotationRecords() | ReadSwitchHistory():
                return await self.reads.answer(action, self.host)
            case Emit():
                # Held until the flow's next other action (``drive``).
                self._held.append(self._event_of(action.notice))
                return None
            case Progress():
                await self.sink.handle(
                    ev.StepProgress(
                        self.run_id,
                        self.host,
                        action.step,
                        action.text,
                        action.elapsed_s,
                        self.history if action.start_up else None,
                    )
                )
                return None
            case _:
                assert_never(action)

    async def _run(self, action: RunCommand) -> CommandResult:
        on_line = None if action.quiet else self._collector(action.step)
        # Lines reach the sinks while the command runs, not after it.
        pump = asyncio.create_task(self._pump_lines())
        try:
            transport, become = self._where(action.on)
            result = await run_command(
                transport,
                become,
                action.argv,
                action.run_as,
                timeout_s=action.timeout_s,
                on_line=on_line,
                stdin=action.stdin,
            )
        except HostError as e:
            result = CommandResult(
                argv=action.argv,
                exit_status=None,
                stdout="",
                stderr=e.reason,
                duration_s=0.0,
                host_key_refused=isinstance(e, HostKeyError),
            )
            if on_line is not None:
                on_line("stderr", f"[bot] {e.reason}")
        finally:
            self._lines.put_nowait(None)
            await pump
        return result

    async def _deep_state(self) -> DeepStateRead:
        """NVML's deep readings where the bot runs on the host (``gpu_health`` is set
        there); none for a remote host, whose flow runs nvidia-smi -q -x."""
        if self.gpu_health is None:
            return DeepStateRead()
        try:
            deep = await self.gpu_health.read_deep()
        except GpuQueryError as e:
            return DeepStateRead(nvml_error=e.reason)
        return DeepStateRead(deep.readings, deep.driver_version)

    async def _gpu_state(self, action: ReadGpuState) -> GpuStateRead:
        """NVML where the bot runs on the host; its command (``nvidia-smi -q``) on a remote
        host, and where NVML fails (the read says why)."""
        failed = None
        if self.gpu_health is not None:
            try:
                return GpuStateRead(HealthSource.NVML, await self.gpu_health.read())
            except GpuQueryError as e:
                failed = e.reason
        result = await self._run(action.fallback)
        return GpuStateRead(HealthSource.NVIDIA_SMI, result=result, nvml_error=failed)

    def _where(self, on: str | None) -> tuple[HostTransport, Become | None]:
        """The transport and ``become`` of the host an action names (the flow's own for
        None). A flow names only configured hosts (bot.core.routers.target)."""
        if on is None or on == self.host:
            return self.transport, self.become
        if self.reach is None:
            raise HostError(on, f"this run cannot reach host {on}")
        return self.reach(on)

    async def _http(self, action: HttpCheck) -> HttpResult:
        try:
            transport, _ = self._where(action.on)
            return await transport.http_request(
                action.method,
                action.url,
                timeout_s=action.timeout_s,
                body=action.body,
                content_type=action.content_type,
            )
        except HostError as e:
            return HttpResult(action.url, None, error=e.reason)

    def _collector(self, step: Step) -> Callable[[Stream, str], None]:
        def on_line(stream: Stream, line: str) -> None:
            # Called synchronously from the reader; delivery to sinks is async.  The
            # transports bound a line already; cutting here holds every sink to the same
            # bound whatever transport fed it (the tail keeps TAIL_LINES of them).
            line = cut_line(line)
            self._tail.append(line)
            self._lines.put_nowait(ev.OutputLine(self.run_id, self.host, step, stream, line))

        return on_line

    async def _pump_lines(self) -> None:
        while (line := await self._lines.get()) is not None:
            await self.sink.handle(line)

    def _event_of(self, notice: Notice) -> ev.Event:
        # Exhaustive as ``_perform``: a notice nobody turns into an event fails mypy.
        match notice:
            case BeginStep():
                self._step_started = self.clock()
                self._tail.clear()
                return ev.StepStarted(self.run_id, self.host, notice.step, notice.command)
            case EndStep():
                output = "\n".join(self._tail)
                if notice.detail:
                    output = f"{output}\n{notice.detail}" if output else notice.detail
                return ev.StepFinished(
                    self.run_id,
                    self.host,
                    notice.step,
                    StepStatus.OK if notice.ok else StepStatus.FAILED,
                    notice.exit_status,
                    self.clock() - self._step_started,
                    notice.summary,
                    output,
                )
            case Snapshot():
                return ev.GpuTable(self.run_id, self.host, notice.label, notice.snapshot)
            case Versions():
                return ev.VersionsKnown(self.run_id, self.host, notice.before, notice.after)
            case Packages():
                return ev.PackagesKnown(
                    self.run_id,
                    self.host,
                    notice.kind,
                    notice.diff,
                    notice.freeze,
                    notice.lock,
                    notice.note,
                )
            case Health():
                return ev.GpuHealthKnown(self.run_id, self.host, notice.check)
            case RotationChange():
                return ev.RotationChanged(
                    self.run_id,
                    self.host,
                    notice.router,
                    notice.server,
                    notice.change,
                    notice.ok,
                    notice.detail,
                    notice.held,
                )
            case ReleaseSwitch():
                return ev.ReleaseSwitched(
                    self.run_id,
                    self.host,
                    notice.service,
                    notice.before,
                    notice.after,
                    notice.kind,
                )
            case _:
                assert_never(notice)
