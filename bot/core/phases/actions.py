"""What a flow yields and what it is answered: the actions the executor performs
(``bot.engine.executor``), the notices it turns into events, the replies it sends back,
and the outcome a flow returns. The one place the flow/executor protocol is written."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, TypeVar, assert_never

from bot.core.deep_query import DeepReading
from bot.core.gpu import GpuSnapshot
from bot.core.health import GpuCheck, GpuStateRead
from bot.core.leftovers import Approval, AskApproval
from bot.core.packages import EnvKind, PackageDiff
from bot.core.plan import Step
from bot.core.privilege import Privilege, run_as_of
from bot.core.releases import Switch, SwitchKind
from bot.core.results import CommandResult, HttpResult
from bot.core.service_state import ServiceState
from bot.core.status import HostStatus


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
    # it into a sudo prefix on hosts with `become = "sudo"` (bot.core.become.become).
    run_as: Privilege = Privilege.NONE
    # Where it runs: None, the flow's own host; else another configured host (a router's
    # host, a sibling replica), which the executor reaches through the engine's pool.
    on: str | None = None


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
    # As ``RunCommand.on``: asked from the flow's host, or from another configured host.
    on: str | None = None


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
    """The GPU check's verdict on a host: read at the request for the approval card, and
    by a run's own GPU check (its step shows it; the metrics keep it)."""

    check: GpuCheck


RotationChangeKind = Literal["out", "in"]


@dataclass(frozen=True, slots=True)
class RotationChange:
    """A replica taken out of its router's rotation or put back (issue 19), whether the
    router took the change (``ok``), and what it said: every one is an audit row."""

    router: str
    server: str
    change: RotationChangeKind
    ok: bool
    detail: str = ""
    # The replica was out before the run (by hand): the bot left it so and sent the
    # router nothing; the row records the decision (``detail`` says why).
    held: bool = False


@dataclass(frozen=True, slots=True)
class ReleaseSwitch:
    """The venv's link of ``service`` now points at release ``after``, and pointed at
    ``before`` (None: no release): every switch the bot makes is an audit row, the
    history a rollback by hand goes by (``bot.core.releases.rollback_target``)."""

    service: str
    before: str | None
    after: str
    kind: SwitchKind


Notice = (
    BeginStep | EndStep | Snapshot | Versions | Packages | Health | RotationChange | ReleaseSwitch
)


@dataclass(frozen=True, slots=True)
class ReadRotationRecords:
    """The audit log's word on which of ``servers`` a run left out of ``router``'s
    rotation (their last recorded change an "out", or a failed "in"): what the command
    kind, whose router cannot say, goes by before it counts a replica as serving."""

    router: str
    servers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RotationRecords:
    """Each server the records hold out, with why; ``error``: the log could not say."""

    held_out: dict[str, str]
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ReadSwitchHistory:
    """The audit log's switches of ``service``'s link on the flow's host, oldest first
    (the newest ``bot.audit.release_switches.HISTORY`` of them)."""

    service: str


@dataclass(frozen=True, slots=True)
class SwitchHistory:
    """The switches; ``error``: the log could not say (then ``switches`` is empty)."""

    switches: tuple[Switch, ...]
    error: str | None = None


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


@dataclass(frozen=True, slots=True)
class ReadDeepState:
    """The deep GPU check's per-GPU readings (issue 23) through NVML where the bot runs on
    the host; a remote host's reply has none, and the flow runs nvidia-smi instead."""


@dataclass(frozen=True, slots=True)
class DeepStateRead:
    readings: tuple[DeepReading, ...] | None = None  # None: read with nvidia-smi
    driver: str | None = None
    nvml_error: str | None = None  # NVML was tried and failed: why


@dataclass(frozen=True, slots=True)
class AskSudo:
    """Whether sudo would run ``argv`` as the account it needs, asked with ``sudo -n -l``
    and never run: a host run's preflight asks it of every maintenance command before it
    stops anything (issue 23). The executor asks only where the host runs it through
    sudo (``Become.question``), and runs the question as the login."""

    step: Step
    argv: tuple[str, ...]
    run_as: Privilege
    timeout_s: float


@dataclass(frozen=True, slots=True)
class SudoAnswer:
    """``asked`` False: the host runs the command as it is (``become = "none"``)."""

    asked: bool = True
    refused: str | None = None  # sudo would not run it: sudo's words, in a few
    rule: str = ""  # ...and the rule the host's drop-in lacks (``Become.missing_rule``)
    lost: str | None = None  # no answer came: why


Action = (
    RunCommand
    | HttpCheck
    | ReadGpuState
    | ReadDeepState
    | Sleep
    | Checkpoint
    | Emit
    | Progress
    | AskApproval
    | ReadRotationRecords
    | ReadSwitchHistory
    | AskSudo
)


@dataclass(frozen=True, slots=True)
class HostOutcome:
    status: HostStatus
    summary: str
    # How the run left the service on this host; the summary's words for it ("the
    # service is STOPPED") are rendered from it (``service_is``), never written apart.
    state: ServiceState
    version_before: str | None = None
    version_after: str | None = None


def service_is(state: ServiceState, *, mid: bool = False) -> str:
    """The words a summary uses for how the service was left ("The service is DOWN";
    ``mid``: within a sentence, "the service is STOPPED"), from the value itself, so the
    sentence and ``HostOutcome.state`` never disagree."""
    match state:
        case ServiceState.UP:
            word = "UP"
        case ServiceState.UP_NOT_READY:
            word = "UP but NOT READY"
        case ServiceState.DOWN:
            word = "DOWN"
        case ServiceState.STOPPED:
            word = "STOPPED"
        case ServiceState.UNKNOWN:
            return f"{'w' if mid else 'W'}hether the service runs is unknown"
        case _:
            assert_never(state)
    return f"{'t' if mid else 'T'}he service is {word}"


# What the executor answers, per action: RunCommand -> CommandResult; HttpCheck ->
# HttpResult; ReadGpuState -> GpuStateRead; AskApproval -> Approval; Sleep and
# Checkpoint -> Tick; ReadRotationRecords -> RotationRecords; ReadSwitchHistory ->
# SwitchHistory; AskSudo -> SudoAnswer; Emit and Progress -> None.
# The helpers below yield one action and narrow its reply, so no flow code handles a
# reply of the wrong type.
Reply = (
    CommandResult
    | HttpResult
    | GpuStateRead
    | DeepStateRead
    | Tick
    | Approval
    | RotationRecords
    | SwitchHistory
    | SudoAnswer
    | None
)

T = TypeVar("T")
R = TypeVar(
    "R",
    CommandResult,
    HttpResult,
    GpuStateRead,
    DeepStateRead,
    Tick,
    Approval,
    RotationRecords,
    SwitchHistory,
    SudoAnswer,
)
# A part of a flow: yields actions, is answered with replies, returns a T.
Phase: TypeAlias = Generator[Action, Reply, T]
Flow = Phase[HostOutcome]


def _expect(reply: Reply, kind: type[R], action: Action) -> R:
    """The reply narrowed to what ``action`` is answered with; anything else is a bug of
    whoever drives the flow (the executor, a test's host), said at once."""
    if not isinstance(reply, kind):
        raise TypeError(
            f"{type(action).__name__} was answered with {type(reply).__name__}, not {kind.__name__}"
        )
    return reply


def run(
    step: Step,
    argv: tuple[str, ...],
    timeout: float,
    *,
    quiet: bool = False,
    stdin: bytes | None = None,
    on: str | None = None,
) -> Phase[CommandResult]:
    action = RunCommand(step, argv, timeout, quiet, stdin, run_as_of(argv), on)
    return _expect((yield action), CommandResult, action)


def http(
    url: str,
    timeout_s: float,
    method: str = "GET",
    body: bytes | None = None,
    content_type: str | None = None,
    on: str | None = None,
) -> Phase[HttpResult]:
    action = HttpCheck(url, timeout_s, method, body, content_type, on)
    return _expect((yield action), HttpResult, action)


def read_deep_state() -> Phase[DeepStateRead]:
    action = ReadDeepState()
    return _expect((yield action), DeepStateRead, action)


def read_gpu_state(fallback: RunCommand) -> Phase[GpuStateRead]:
    action = ReadGpuState(fallback)
    return _expect((yield action), GpuStateRead, action)


def ask(question: str, pids: tuple[int, ...]) -> Phase[Approval]:
    action = AskApproval(question, pids)
    return _expect((yield action), Approval, action)


def pause(seconds: float | None = None) -> Phase[Tick]:
    """A safe point (``None``) or a sleep; either way the clock and the cancel flag."""
    action = Checkpoint() if seconds is None else Sleep(seconds)
    return _expect((yield action), Tick, action)


def rotation_records(router: str, servers: tuple[str, ...]) -> Phase[RotationRecords]:
    action = ReadRotationRecords(router, servers)
    return _expect((yield action), RotationRecords, action)


def switch_history(service: str) -> Phase[SwitchHistory]:
    action = ReadSwitchHistory(service)
    return _expect((yield action), SwitchHistory, action)


def ask_sudo(step: Step, argv: tuple[str, ...], timeout_s: float) -> Phase[SudoAnswer]:
    action = AskSudo(step, argv, run_as_of(argv), timeout_s)
    return _expect((yield action), SudoAnswer, action)
