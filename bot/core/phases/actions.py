"""What a flow yields and what it is answered: the actions the executor performs
(``bot.engine.executor``), the notices it turns into events, the replies it sends back,
and the outcome a flow returns. The one place the flow/executor protocol is written."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from bot.core.gpu import GpuSnapshot
from bot.core.health import GpuCheck
from bot.core.leftovers import AskApproval
from bot.core.packages import EnvKind, PackageDiff
from bot.core.plan import Step
from bot.core.privilege import Privilege, run_as_of
from bot.core.results import CommandResult
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


def run(step: Step, argv: tuple[str, ...], timeout: float, *, quiet: bool = False,
         stdin: bytes | None = None) -> Generator[Action, Any, CommandResult]:
    result: CommandResult = yield RunCommand(step, argv, timeout, quiet, stdin, run_as_of(argv))
    return result


def pause(seconds: float | None = None) -> Generator[Action, Any, Tick]:
    tick: Tick = yield (Checkpoint() if seconds is None else Sleep(seconds))
    return tick
