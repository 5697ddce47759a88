"""What a starting vLLM server is doing, read from its journal lines: pure.

A model of a trillion parameters takes many minutes to load across 8 GPUs; the
health gate follows the unit's journal meanwhile (``bot.core.flows``), feeds each new
line to a ``StartupWatch`` and shows its phase on the status card ("loading weights
60 %", "capturing CUDA graphs", "API server up").  A line that means the start has
failed (CUDA out of memory, an NCCL error, the engine core failing to initialise, a
Python traceback) ends the wait at once, with the lines that say so. A traceback that
CPython's ``threading.excepthook`` prints for a thread other than the main one
("Exception in thread Thread-3 (_report_usage_worker):", then the traceback) is not: the
thread died, the process goes on; it is a warning on the progress line and in the step's
output, and ``/health`` decides.

The patterns are vLLM's own log formats; tests/test_startup.py names the vLLM source
file each one comes from.  A line that only looks alarming during a normal start
(vLLM's "No available shared memory broadcast block found in 60 seconds", which a
worker logs while another one compiles) is never a failure.
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal


class Phase(IntEnum):
    """Start-up phases in the order vLLM goes through them."""

    STARTING = 1
    ENGINE = 2
    LOADING = 3
    LOADED = 4
    COMPILING = 5
    KV_CACHE = 6
    CUDA_GRAPHS = 7
    ENGINE_READY = 8
    API_STARTING = 9
    API_UP = 10


PHASE_LABELS: dict[Phase, str] = {
    Phase.STARTING: "process started",
    Phase.ENGINE: "initialising the engine",
    Phase.LOADING: "loading weights",
    Phase.LOADED: "weights loaded",
    Phase.COMPILING: "torch.compile",
    Phase.KV_CACHE: "sizing the KV cache",
    Phase.CUDA_GRAPHS: "capturing CUDA graphs",
    Phase.ENGINE_READY: "engine initialised",
    Phase.API_STARTING: "starting the API server",
    Phase.API_UP: "API server up",
}

# A tqdm bar in vLLM's own format ("NN% Completed | a/b") or tqdm's default ("NN%|...| a/b").
_BAR = r"(?P<pct>\d{1,3})%(?: Completed \||\|[^|]*\|)\s*(?P<done>\d+)/(?P<total>\d+)"

# vLLM 0.4-0.6 (the V0 engine) words some phases differently; each is mapped onto the
# same phase (tests/test_real_vllm_samples.py names the 2024 logs they come from):
# "args: Namespace(...)", "Using model weights format [...]", "Loading model weights took
# N GB", "# GPU blocks: N, # CPU blocks: M" (later "# cuda blocks"), "Memory profiling
# ...", "Capturing the model for CUDA graphs." (later "Capturing cudagraphs for
# decoding."), uvicorn's "Started server process", "Waiting for application startup"
# and, after "Application startup complete", "Uvicorn running on".
_PHASES: tuple[tuple[Phase, re.Pattern[str]], ...] = (
    (Phase.API_UP, re.compile(r"Application startup complete|Uvicorn running on")),
    (
        Phase.API_STARTING,
        re.compile(
            r"Starting vLLM API server|Available routes are|"
            r"Route: /\S*, Methods:|Started server process|"
            r"Waiting for application startup"
        ),
    ),
    (
        Phase.ENGINE_READY,
        re.compile(
            r"init engine \(profile, create kv cache, warmup model\) "
            r"took|Graph capturing finished in"
        ),
    ),
    (
        Phase.CUDA_GRAPHS,
        re.compile(
            r"Capturing CUDA graph|Capturing the model for CUDA graphs|"
            r"Capturing cudagraphs for|CUDA graphs can take additional"
        ),
    ),
    # The V1 engine profiles its memory to size the KV cache: a warm-up run, then (2026 on)
    # the CUDA graphs' memory, before "Available KV cache memory" (minutes on a big model).
    (
        Phase.KV_CACHE,
        re.compile(
            r"GPU KV cache size:|Available KV cache memory:|"
            r"Maximum concurrency for|# (?:GPU|cuda) blocks: \d|"
            r"Memory profiling (?:takes|results)|Initial profiling/warmup run|"
            r"(?:Profiling|Estimated) CUDA graph memory"
        ),
    ),
    # "torch.compile takes %.2f s in total" became "took" in later vLLM (seen in 2026 logs).
    (
        Phase.COMPILING,
        re.compile(
            r"Dynamo bytecode transform time|Compiling a graph for|"
            r"torch\.compile t(?:akes|ook)|for vLLM's torch\.compile"
        ),
    ),
    (Phase.LOADED, re.compile(r"Model loading took|Loading (?:model )?weights took")),
    (
        Phase.LOADING,
        re.compile(
            r"Starting to load model|Loading safetensors checkpoint shards|"
            r"Loading pt checkpoint shards|Loading model from scratch|"
            r"Using model weights format"
        ),
    ),
    (Phase.ENGINE, re.compile(r"Initializing an? (?:V[01] )?LLM engine")),
    # vLLM 0.11 on has no "vLLM API server version" line: its version ends an ASCII banner
    # ("▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.30.0").
    (
        Phase.STARTING,
        re.compile(
            r"vLLM API server version|Started .*\.service|"
            r"non-default args:|\] args: Namespace\(|[█▀▄]\s+version \d"
        ),
    ),
)
_PERCENT_PHASES = frozenset({Phase.LOADING, Phase.CUDA_GRAPHS})

# Lines that end the wait. Order only decides which reason is named first.
_FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # torch's allocator says "CUDA out of memory"; CUDA itself (a custom op, the driver
    # API) raises "RuntimeError: CUDA error: out of memory" or "CUDA driver error: ...".
    (
        "CUDA out of memory",
        re.compile(
            r"CUDA out of memory|OutOfMemoryError|"
            r"CUDA (?:driver )?error: out of memory"
        ),
    ),
    (
        "NCCL error",
        re.compile(
            r"NCCL error|ncclInternalError|ncclSystemError|"
            r"ncclUnhandledCudaError|DistBackendError"
        ),
    ),
    # The engine core's own line comes first ("EngineCore failed to start.", core.py), the
    # API server's wrapper last.
    (
        "engine core initialization failed",
        re.compile(r"Engine core initialization failed|EngineCore failed to start"),
    ),
    # A served engine that died (vllm#44281; vllm-metal#112): the watch window's line, and
    # the engine core's own ("EngineCore encountered a fatal error.", core.py) before it.
    (
        "engine dead",
        re.compile(
            r"EngineDeadError|AsyncLLM output_handler failed|EngineCore encountered a fatal error"
        ),
    ),
    ("Python traceback", re.compile(r"Traceback \(most recent call last\):")),
)
# Never a failure, whatever else the line holds: logged during normal start-ups while
# another worker compiles or quantises (vllm/distributed/device_communicators/shm_broadcast.py).
_BENIGN = (re.compile(r"No available shared memory broadcast block found"),)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# Lines kept of a failure: a few before the first failure line, the first ones from it,
# and the last ones (a traceback's exception is its last line), with a count between.
_CONTEXT_BEFORE = 3
_FAILURE_HEAD = 12
_FAILURE_TAIL = 30
# Exception lines kept from the lines not shown. vLLM logs the root cause first (the engine
# core's traceback) and then wraps it in longer tracebacks ending "See root cause above":
# a real journal of a failed start put ~60 lines between the cause and the end.
_FAILURE_CAUSES = 5
MAX_LINE_CHARS = 500


def clean(line: str) -> str:
    """A journal line as a person reads it: the last redraw of a ``\\r`` progress bar,
    no terminal colour codes, at most ``MAX_LINE_CHARS``."""
    parts = [p for p in line.rstrip("\n").split("\r") if p.strip()]
    text = _ANSI.sub("", parts[-1] if parts else "")
    return text[:MAX_LINE_CHARS]


def failure_of(line: str) -> str | None:
    """Why ``line`` means the start has failed, or None."""
    if any(p.search(line) for p in _BENIGN):
        return None
    return next((why for why, p in _FAILURES if p.search(line)), None)


def phase_of(line: str) -> tuple[Phase, int | None, str] | None:
    """The phase a line shows, with its percentage and ``done/total`` when it is a
    progress bar; None for a line that says nothing about the phase."""
    for phase, pattern in _PHASES:
        if pattern.search(line):
            if phase in _PERCENT_PHASES and (bar := re.search(_BAR, line)):
                return phase, min(int(bar["pct"]), 100), f"{bar['done']}/{bar['total']}"
            return phase, None, ""
    return None


@dataclass(frozen=True, slots=True)
class Failure:
    reason: str  # "CUDA out of memory", ...
    lines: tuple[str, ...]  # the line that said so, a few before it and what followed


class StartupWatch:
    """Fed the journal's new lines poll by poll; knows the furthest phase reached and
    whether a line said the start failed. Holds a bounded number of lines."""

    def __init__(self) -> None:
        self.phase: Phase | None = None
        self.percent: int | None = None
        self.progress = ""  # "38/64" of a progress bar
        self.lines_seen = 0
        self._recent: deque[str] = deque(maxlen=_CONTEXT_BEFORE)
        self._failure_reason: str | None = None
        self._failure_head: list[str] = []
        self._failure_tail: deque[str] = deque(maxlen=_FAILURE_TAIL)
        self._failure_causes: list[str] = []
        self._failure_skipped = 0
        self._threads = _ThreadExceptions()

    def feed(self, lines: Iterable[str]) -> None:
        for raw in lines:
            line = clean(raw)
            if not line.strip():
                continue
            self.lines_seen += 1
            if self._failure_reason is not None:
                self._keep_failure_line(line)
                continue
            if self._threads.take(line):
                self._recent.append(line)
                self._see(line)  # a header may follow a progress bar on its line (#6340)
                continue
            why = failure_of(line)
            if why is not None:
                self._failure_reason = why
                self._failure_head = [*self._recent, line]
                continue
            self._recent.append(line)
            self._see(line)

    def _keep_failure_line(self, line: str) -> None:
        if len(self._failure_head) < _CONTEXT_BEFORE + _FAILURE_HEAD:
            self._failure_head.append(line)
            return
        if len(self._failure_tail) == self._failure_tail.maxlen:
            self._drop(self._failure_tail[0])
        self._failure_tail.append(line)

    def _drop(self, line: str) -> None:
        """``line`` leaves the tail unshown, unless it names an exception (a root cause)."""
        if _looks_like_exception(line) and len(self._failure_causes) < _FAILURE_CAUSES:
            self._failure_causes.append(line)
        else:
            self._failure_skipped += 1

    def _see(self, line: str) -> None:
        seen = phase_of(line)
        if seen is None:
            return
        phase, percent, progress = seen
        if self.phase is not None and phase < self.phase:
            return  # a late line of an earlier phase (another worker) does not go back
        if phase != self.phase:
            self.percent, self.progress = None, ""
        self.phase = phase
        if percent is not None:
            self.percent, self.progress = percent, progress

    @property
    def failure(self) -> Failure | None:
        """The failure, named by the most specific reason its lines give (a traceback
        whose exception is a CUDA OOM is "CUDA out of memory")."""
        if self._failure_reason is None:
            return None
        cut = [f"… {self._failure_skipped} lines not shown …"] if self._failure_skipped else []
        lines = (*self._failure_head, *cut, *self._failure_causes, *self._failure_tail)
        reason = next(
            (why for why, p in _FAILURES if any(p.search(ln) and failure_of(ln) for ln in lines)),
            self._failure_reason,
        )
        return Failure(reason, lines)

    @property
    def thread_exceptions(self) -> tuple[ThreadException, ...]:
        """Threads (not the main one) that died of an exception so far, oldest first."""
        return self._threads.seen()

    def text(self) -> str:
        """The phase as the card shows it: "loading weights 60 % (38/64)", and a warning
        when a thread died ("...; warning: thread Thread-3 (_report_usage_worker) died:
        PermissionError: ...")."""
        if self.phase is None:
            label = "waiting for the first log line"
        else:
            label = PHASE_LABELS[self.phase]
            if self.percent is not None:
                label += f" {self.percent} %"
                if self.progress:
                    label += f" ({self.progress})"
        warning = self._threads.warning()
        return f"{label}; {warning}" if warning else label


# ---- an uncaught exception in a thread that is not the main one -----------------------------

# CPython's threading.excepthook (Lib/threading.py) writes "Exception in thread <name>:"
# and then the thread's traceback to stderr. The thread has died; the process goes on.
# vLLM's usage-stats daemon thread (vllm/usage/usage_lib.py, _report_usage_worker) dies
# that way when it cannot write ~/.config/vllm/usage_stats.json, as under systemd's
# ProtectHome= (vllm-project/vllm issue #6340 shows the header and traceback).
_THREAD_HEADER = re.compile(r"Exception in thread (?P<name>.+?):\s*$")
# What vLLM puts before a child process's lines: "(EngineCore_DP0 pid=4188) ".
_PREFIX = re.compile(r"^\([^()]*pid=\d+\) ?")
_TB_HEADER = "Traceback (most recent call last):"
_CHAINED = frozenset(
    {
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
    }
)
# A traceback's last line: a (dotted) class name at the start of the line, then ": message"
# or nothing ("socket.gaierror: ...", "KeyboardInterrupt"). An all-capitals word is a log
# level (uvicorn's "INFO:     ..."), not an exception.
_EXCEPTION_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*)(?::(?:\s.*)?)?$")
# Lines of another kind the block lets pass (logged meanwhile by other threads) before it
# gives up waiting for the traceback that follows its header.
_THREAD_STRAYS = 5
_THREAD_LINES_KEPT = 12
_THREADS_KEPT = 5
_WARNING_CHARS = 240

ThreadVerdict = Literal["part", "end", "other"]


@dataclass(frozen=True, slots=True)
class ThreadException:
    thread: str  # "Thread-3 (_report_usage_worker)"
    last: str  # its exception line, "" while (or when) none came
    lines: tuple[str, ...]  # the header and the last lines of the traceback

    def describe(self) -> str:
        text = f"thread {self.thread} died" + (f": {self.last}" if self.last else "")
        return text[:_WARNING_CHARS]


def _split_prefix(line: str) -> tuple[str, str]:
    m = _PREFIX.match(line)
    return (m.group(0).rstrip(), line[m.end() :]) if m else ("", line)


def _is_exception_line(body: str) -> bool:
    m = _EXCEPTION_LINE.match(body)
    return m is not None and not m["name"].isupper()


class _ThreadBlock:
    """One thread's traceback as its lines come, told apart from the lines around it:
    only lines of the same process (prefix) and of a traceback's shape are its; a second
    traceback header without Python's chaining sentence is not."""

    def __init__(self, prefix: str | None, thread: str, header: str) -> None:
        # None: the header followed a progress bar on its line, which hid the prefix
        # (clean() keeps the bar's last redraw); the traceback's header then says it.
        self.prefix, self.thread = prefix, thread
        self.state: Literal["header", "frames", "raised", "chained"] = "header"
        self.last = ""
        self.header = header
        self.lines: deque[str] = deque(maxlen=_THREAD_LINES_KEPT)  # the last ones
        self.taken = 0
        self.strays = 0

    def take(self, line: str) -> ThreadVerdict:
        prefix, body = _split_prefix(line)
        if self.prefix is None and self.state == "header" and body == _TB_HEADER:
            self.prefix = prefix
        if prefix != self.prefix:
            return "other"  # another process's line, in between
        verdict = self._step(body)
        if verdict == "part":
            self.lines.append(line)
            self.taken += 1
        return verdict

    def _step(self, body: str) -> ThreadVerdict:
        if self.state in ("header", "chained"):
            if body == _TB_HEADER:
                self.state = "frames"
                return "part"
            self.strays += 1
            return "end" if self.strays > _THREAD_STRAYS else "other"
        if self.state == "frames":
            if body[:1].isspace():
                return "part"  # a frame, its code, a caret line
            if body in _CHAINED:
                self.state = "chained"
                return "part"
            if body == _TB_HEADER:
                return "end"  # a new traceback, not chained to this one: not the thread's
            if _is_exception_line(body):
                self.last, self.state = body, "raised"
                return "part"
            return "other"  # a log line of another thread, in between
        if body in _CHAINED:  # raised: the traceback goes on only with Python's sentence
            self.state = "chained"
            return "part"
        return "end"

    def done(self) -> ThreadException:
        cut = self.taken - len(self.lines)
        return ThreadException(
            self.thread,
            self.last,
            (self.header, *([f"… {cut} lines not shown …"] if cut else []), *self.lines),
        )


class _ThreadExceptions:
    """The thread exceptions seen (bounded), and the one whose lines are still coming."""

    def __init__(self) -> None:
        self.closed: list[ThreadException] = []
        self.more = 0  # beyond _THREADS_KEPT
        self.open: _ThreadBlock | None = None

    def take(self, line: str) -> bool:
        """Whether ``line`` is a thread exception's (its header or traceback), and so no
        failure of the start. A fatal line (CUDA out of memory...) is never taken: it
        ends the wait wherever it comes from."""
        header = _THREAD_HEADER.search(line)
        if header is not None:
            self._close()
            prefix, body = _split_prefix(line)
            glued = not body.startswith("Exception in thread ")
            self.open = _ThreadBlock(None if glued else prefix, header["name"], line)
            return True
        if self.open is None:
            return False
        verdict = self.open.take(line)
        if verdict == "end":
            self._close()
        why = failure_of(line)
        return verdict == "part" and why in (None, "Python traceback")

    def _close(self) -> None:
        if self.open is not None:
            if len(self.closed) < _THREADS_KEPT:
                self.closed.append(self.open.done())
            else:
                self.more += 1
            self.open = None

    def seen(self) -> tuple[ThreadException, ...]:
        return (*self.closed, *((self.open.done(),) if self.open is not None else ()))

    def warning(self) -> str:
        seen = self.seen()
        if not seen:
            return ""
        others = len(seen) - 1 + self.more
        return f"warning: {seen[-1].describe()}" + (
            f" (and {others} other thread{'s' if others != 1 else ''})" if others else ""
        )


def thread_block(watch: StartupWatch) -> str:
    """The thread exceptions' lines, for a step's output."""
    return "\n\n".join("\n".join(t.lines) for t in watch.thread_exceptions)


# ---- how long starts take ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartHistory:
    """This service's previous successful starts, newest first (seconds from
    ``systemctl start`` to a healthy server), as the audit log recorded them."""

    durations_s: tuple[float, ...] = ()

    @property
    def estimate_s(self) -> float | None:
        """The median, or None before the first successful start."""
        return statistics.median(self.durations_s) if self.durations_s else None

    @property
    def last_s(self) -> float | None:
        return self.durations_s[0] if self.durations_s else None


def history_line(history: StartHistory) -> str:
    """What ``status`` says of this service's starts."""
    if history.last_s is None or history.estimate_s is None:
        return "last start: no successful start recorded yet"
    n = len(history.durations_s)
    return (
        f"last start: ready {duration(history.last_s)} after systemctl start "
        f"(median of the last {n}: {duration(history.estimate_s)})"
    )


def duration(seconds: float) -> str:
    """``42s``, ``6m05s``, ``1h02m``."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_text(
    text: str, elapsed_s: float | None = None, history: StartHistory | None = None
) -> str:
    """A running step's progress line: what it does, how long it has, and how long this
    service's starts usually take (the median of the previous ones; none on the first)."""
    parts = [text]
    if elapsed_s is not None:
        parts.append(f"{duration(elapsed_s)} elapsed")
    estimate = history.estimate_s if history is not None else None
    if estimate is not None and history is not None:
        n = len(history.durations_s)
        parts.append(f"usually ~{duration(estimate)} (median of {n} start{'s' if n != 1 else ''})")
    return " · ".join(parts)


_CURSOR = re.compile(r"[A-Za-z0-9=;_.+-]{1,500}")


def new_lines(output: str, cursor_prefix: str = "-- cursor: ") -> tuple[list[str], str | None]:
    """``journalctl --show-cursor`` output split into its entries and the cursor after
    the last one (None when it printed none: no new entries)."""
    lines = output.splitlines()
    cursor = None
    if lines and lines[-1].startswith(cursor_prefix):
        cursor = lines.pop()[len(cursor_prefix) :].strip()
        # Passed back in the next argv: only what a cursor is made of (s=..;i=..;b=..).
        cursor = cursor if _CURSOR.fullmatch(cursor) else None
    entries = [ln for ln in lines if ln != "-- No entries --"]
    return entries, cursor


def describe_failure(failure: Failure, limit: int = 300) -> str:
    """One line for the summary: the reason and the most telling line (the last exception
    line that is not vLLM's "See root cause above" wrapper, else the first that matched)."""
    exceptions = [ln for ln in failure.lines if _looks_like_exception(ln)]
    causes = [ln for ln in exceptions if not _WRAPPER.search(ln)] or exceptions
    telling = causes[-1] if causes else next((ln for ln in failure.lines if failure_of(ln)), "")
    text = f"{failure.reason}: {telling.strip()}" if telling else failure.reason
    return text[:limit]


# What vLLM's API server raises when an engine core failed (vllm/v1/engine/utils.py) or
# died (EngineDeadError): the cause is in an earlier line.
_WRAPPER = re.compile(r"See root cause above|See stack trace \(above\) for the root cause")
_EXCEPTION = re.compile(r"(?:^|\s|\))(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception):")


def _looks_like_exception(line: str) -> bool:
    return bool(_EXCEPTION.search(line))


def failure_block(failure: Failure) -> str:
    return "\n".join(failure.lines)
