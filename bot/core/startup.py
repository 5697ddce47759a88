"""What a starting vLLM server is doing, read from its journal lines: pure.

A model of a trillion parameters takes many minutes to load across 8 GPUs; the
health gate follows the unit's journal meanwhile (``bot.core.flows``), feeds each new
line to a ``StartupWatch`` and shows its phase on the status card ("loading weights
60 %", "capturing CUDA graphs", "API server up").  A line that means the start has
failed (CUDA out of memory, an NCCL error, the engine core failing to initialise, a
Python traceback) ends the wait at once, with the lines that say so.

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
    (Phase.API_STARTING, re.compile(r"Starting vLLM API server|Available routes are|"
                                    r"Route: /\S*, Methods:|Started server process|"
                                    r"Waiting for application startup")),
    (Phase.ENGINE_READY, re.compile(r"init engine \(profile, create kv cache, warmup model\) "
                                    r"took|Graph capturing finished in")),
    (Phase.CUDA_GRAPHS, re.compile(r"Capturing CUDA graph|Capturing the model for CUDA graphs|"
                                   r"Capturing cudagraphs for|CUDA graphs can take additional")),
    (Phase.KV_CACHE, re.compile(r"GPU KV cache size:|Available KV cache memory:|"
                                r"Maximum concurrency for|# (?:GPU|cuda) blocks: \d|"
                                r"Memory profiling (?:takes|results)")),
    # "torch.compile takes %.2f s in total" became "took" in later vLLM (seen in 2026 logs).
    (Phase.COMPILING, re.compile(r"Dynamo bytecode transform time|Compiling a graph for|"
                                 r"torch\.compile t(?:akes|ook)|for vLLM's torch\.compile")),
    (Phase.LOADED, re.compile(r"Model loading took|Loading (?:model )?weights took")),
    (Phase.LOADING, re.compile(r"Starting to load model|Loading safetensors checkpoint shards|"
                               r"Loading pt checkpoint shards|Loading model from scratch|"
                               r"Using model weights format")),
    (Phase.ENGINE, re.compile(r"Initializing an? (?:V[01] )?LLM engine")),
    (Phase.STARTING, re.compile(r"vLLM API server version|Started .*\.service|"
                                r"non-default args:|\] args: Namespace\(")),
)
_PERCENT_PHASES = frozenset({Phase.LOADING, Phase.CUDA_GRAPHS})

# Lines that end the wait. Order only decides which reason is named first.
_FAILURES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # torch's allocator says "CUDA out of memory"; CUDA itself (a custom op, the driver
    # API) raises "RuntimeError: CUDA error: out of memory" or "CUDA driver error: ...".
    ("CUDA out of memory", re.compile(r"CUDA out of memory|OutOfMemoryError|"
                                      r"CUDA (?:driver )?error: out of memory")),
    ("NCCL error", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|"
                              r"ncclUnhandledCudaError|DistBackendError")),
    ("engine core initialization failed", re.compile(r"Engine core initialization failed")),
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

    def feed(self, lines: Iterable[str]) -> None:
        for raw in lines:
            line = clean(raw)
            if not line.strip():
                continue
            self.lines_seen += 1
            if self._failure_reason is not None:
                self._keep_failure_line(line)
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
        reason = next((why for why, p in _FAILURES
                       if any(p.search(ln) and failure_of(ln) for ln in lines)),
                      self._failure_reason)
        return Failure(reason, lines)

    def text(self) -> str:
        """The phase as the card shows it: "loading weights 60 % (38/64)"."""
        if self.phase is None:
            return "waiting for the first log line"
        label = PHASE_LABELS[self.phase]
        if self.percent is not None:
            label += f" {self.percent} %"
            if self.progress:
                label += f" ({self.progress})"
        return label


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
    return (f"last start: ready {duration(history.last_s)} after systemctl start "
            f"(median of the last {n}: {duration(history.estimate_s)})")


def duration(seconds: float) -> str:
    """``42s``, ``6m05s``, ``1h02m``."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def progress_text(text: str, elapsed_s: float | None = None,
                  history: StartHistory | None = None) -> str:
    """A running step's progress line: what it does, how long it has, and how long this
    service's starts usually take (the median of the previous ones; none on the first)."""
    parts = [text]
    if elapsed_s is not None:
        parts.append(f"{duration(elapsed_s)} elapsed")
    estimate = history.estimate_s if history is not None else None
    if estimate is not None and history is not None:
        n = len(history.durations_s)
        parts.append(f"usually ~{duration(estimate)} (median of {n} start"
                     f"{'s' if n != 1 else ''})")
    return " · ".join(parts)


_CURSOR = re.compile(r"[A-Za-z0-9=;_.+-]{1,500}")


def new_lines(output: str, cursor_prefix: str = "-- cursor: ") -> tuple[list[str], str | None]:
    """``journalctl --show-cursor`` output split into its entries and the cursor after
    the last one (None when it printed none: no new entries)."""
    lines = output.splitlines()
    cursor = None
    if lines and lines[-1].startswith(cursor_prefix):
        cursor = lines.pop()[len(cursor_prefix):].strip()
        # Passed back in the next argv: only what a cursor is made of (s=..;i=..;b=..).
        cursor = cursor if _CURSOR.fullmatch(cursor) else None
    entries = [ln for ln in lines if ln != "-- No entries --"]
    return entries, cursor


def describe_failure(failure: Failure, limit: int = 300) -> str:
    """One line for the summary: the reason and the most telling line (the last exception
    line that is not vLLM's "See root cause above" wrapper, else the first that matched)."""
    exceptions = [ln for ln in failure.lines if _looks_like_exception(ln)]
    causes = [ln for ln in exceptions if not _WRAPPER.search(ln)] or exceptions
    telling = causes[-1] if causes else next(
        (ln for ln in failure.lines if failure_of(ln)), "")
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

