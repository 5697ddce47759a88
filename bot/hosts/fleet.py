"""GPU status across hosts: one concurrent fan-out, a row per host, never a failed query.

A broken or unreachable host becomes a row saying why; the answer comes back in
about the time of the slowest host (bounded by the per-host timeout).  Each
host's two nvidia-smi queries run at once on its pooled SSH connection, so a
repeat query costs no handshake.

``fleet_message`` shapes the answer for chat: the full per-GPU tables when they
fit, else a fleet summary with one line per host (problem hosts first) and the
full tables as an attachment.

Each host's GPU health is read with its GPUs (``bot.core.health``: ``nvidia-smi -q``,
or NVML on the bot's own machine, and the kernel's Xid lines): a HEALTH column per
host, a mark per GPU in its table, ``health_details`` for ``--health``. A health read
that fails costs its mark, never the row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from bot.core import remote, table
from bot.core.gpu import (
    DriverWarning,
    Gpu,
    GpuSnapshot,
    build_snapshot,
    check_nvidia_smi,
    render_table,
)
from bot.core.health import HostHealth, Level, details, health_reads, marks
from bot.core.table import Column
from bot.errors import (
    ChatOpsError,
    GpuQueryError,
    HostError,
    HostKeyError,
    HostUnreachableError,
    InputError,
)
from bot.hosts.base import CommandResult, HostTransport
from bot.hosts.nvml import LocalGpuHealth, probe_local
from bot.hosts.pool import HostPool
from bot.settings import Settings

log = logging.getLogger(__name__)

DEFAULT_HOST_TIMEOUT_S = 10.0
# A GPU with more than this in use (or any compute process) counts as busy.
BUSY_MIB = 1024
# Slack caps a section's text at 3000 characters; the rest is room for the code fences.
MESSAGE_CHARS = 2900
_MIN_MESSAGE_CHARS = 400
_ROW_LIMIT = 100
_HOST_WIDTH = 24
_GAP = "  "


@dataclass(frozen=True, slots=True)
class HostGpus:
    host: str
    snapshot: GpuSnapshot | None
    error: str | None
    duration_s: float
    # No answer at all (connect refused, host key refused, nothing within the timeout),
    # as opposed to a host that answered but whose GPU query failed.
    unreachable: bool = False
    # The GPUs' hardware health (None: it could not be read; ``health_error`` says why).
    health: HostHealth | None = None
    health_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.snapshot is not None


def resolve_targets(settings: Settings, target: str | None) -> list[str]:
    """All hosts, one host, or a service's hosts."""
    if target is None:
        return sorted(settings.hosts)
    if target in settings.hosts:
        return [target]
    if target in settings.services:
        return list(settings.services[target].hosts)
    hosts = ", ".join(sorted(settings.hosts)) or "none"
    services = ", ".join(sorted(settings.services)) or "none"
    raise InputError(f"`{target[:64]}` is neither a host ({hosts}) nor a service ({services})")


async def query_transport(transport: HostTransport, timeout_s: float) -> GpuSnapshot:
    gpus, apps = await asyncio.gather(
        transport.run(remote.gpu_query(), timeout_s=timeout_s),
        transport.run(remote.apps_query(), timeout_s=timeout_s),
    )
    check_nvidia_smi(transport.host, gpus)
    check_nvidia_smi(transport.host, apps)
    return build_snapshot(transport.host, gpus.stdout, apps.stdout, (gpus.stderr, apps.stderr))


async def query_health(
    transport: HostTransport,
    gpus: Sequence[Gpu],
    timeout_s: float,
    *,
    nvml: LocalGpuHealth | None = None,
    warnings: Sequence[DriverWarning] = (),
) -> HostHealth:
    """Drive ``bot.core.health.health_reads`` over the transport. ``nvml``: the bot's own
    GPUs' state through NVML; where NVML fails, ``nvidia-smi -q`` reads it instead, as a
    run's GPU check does, so the host keeps its health mark. ``warnings``: the GPU
    query's known warnings (a corrupted infoROM), findings like the rest."""
    readings = None
    if nvml is not None:
        try:
            readings = await nvml.read()
        except GpuQueryError as e:
            log.warning("NVML health read failed, reading nvidia-smi -q: %s", e.reason)
    reads = health_reads(transport.host, gpus, readings, warnings=warnings)
    result: CommandResult | None = None
    try:
        while True:
            argv = reads.send(result)  # type: ignore[arg-type]  # None only to start it
            try:
                result = await transport.run(argv, timeout_s=timeout_s)
            except HostError as e:
                result = CommandResult(
                    argv=argv, exit_status=None, stdout="", stderr=e.reason, duration_s=0.0
                )
    except StopIteration as stop:
        health: HostHealth = stop.value
        return health


async def _with_health(
    row: HostGpus, pool: HostPool, transport: HostTransport, timeout_s: float
) -> HostGpus:
    """The row with its GPUs' health, or with why that could not be read."""
    assert row.snapshot is not None
    try:
        async with asyncio.timeout(timeout_s):
            health = await query_health(
                transport,
                row.snapshot.gpus,
                timeout_s,
                nvml=pool.gpu_health(row.host),
                warnings=row.snapshot.warnings,
            )
    except TimeoutError:
        return dataclasses.replace(row, health_error=f"no answer within {timeout_s:g}s")
    except ChatOpsError as e:
        return dataclasses.replace(row, health_error=str(e))
    except Exception as e:  # a bug must cost the mark, not the row
        log.exception("GPU health of %s failed unexpectedly", row.host)
        return dataclasses.replace(row, health_error=f"internal error ({type(e).__name__})")
    return dataclasses.replace(row, health=health)


async def query_host(
    settings: Settings,
    pool: HostPool,
    host: str,
    timeout_s: float = DEFAULT_HOST_TIMEOUT_S,
    *,
    keep: bool = True,
    on_gpus: Callable[[HostGpus], None] | None = None,
) -> HostGpus:
    """One host's snapshot, or a row saying why there is none. Never raises for the host.
    ``keep``: leave its connection in the pool (``HostPool.reading``). ``on_gpus``: told
    the row once its GPUs are read, before their health is (``fleet_gpus``' deadline
    keeps it if the health read is cut off)."""
    if host not in settings.hosts:
        return HostGpus(host, None, "not a configured host", 0.0)
    async with pool.reading(host, keep=keep) as transport:
        return await _query_host(settings, pool, transport, timeout_s, on_gpus)


async def _query_host(
    settings: Settings,
    pool: HostPool,
    transport: HostTransport,
    timeout_s: float,
    on_gpus: Callable[[HostGpus], None] | None = None,
) -> HostGpus:
    host = transport.host
    start = time.monotonic()

    def row(error: str, *, unreachable: bool) -> HostGpus:
        return HostGpus(host, None, error, time.monotonic() - start, unreachable)

    try:
        async with asyncio.timeout(timeout_s):
            if settings.hosts[host].is_local:
                snap = await asyncio.to_thread(probe_local, host, pool.nvml)
            else:
                snap = await query_transport(transport, timeout_s)
    except TimeoutError:
        return row(f"no answer within {timeout_s:g}s", unreachable=True)
    except (HostUnreachableError, HostKeyError) as e:
        return row(e.reason, unreachable=True)
    except HostError as e:
        return row(e.reason, unreachable=False)
    except ChatOpsError as e:
        return row(str(e), unreachable=False)
    except Exception as e:  # a bug must cost one row, not the whole fleet's answer
        log.exception("GPU query of %s failed unexpectedly", host)
        return row(f"internal error ({type(e).__name__}), see the bot's log", unreachable=False)
    got = HostGpus(host, snap, None, time.monotonic() - start)
    if on_gpus is not None:
        on_gpus(got)
    left = max(timeout_s - got.duration_s, 1.0)
    with_health = await _with_health(got, pool, transport, left)
    return dataclasses.replace(with_health, duration_s=time.monotonic() - start)


async def fleet_gpus(
    settings: Settings,
    pool: HostPool,
    hosts: Sequence[str],
    timeout_s: float = DEFAULT_HOST_TIMEOUT_S,
    *,
    deadline: Callable[[], Awaitable[object]] | None = None,
) -> list[HostGpus]:
    """Every host, ``[fleet].max_connections`` at once; the rows come back in the order
    of ``hosts``. Each host's timeout starts when its turn comes, not while it waits
    for a slot: a host behind a slow one is not timed out for having waited. A query
    of more hosts than the limit does not pool the connections it opens (each closed
    after its host's read), so connections open at once stay within the limit.

    The whole query ends when ``deadline`` returns (default: ``[fleet].deadline_s``):
    hung hosts each hold a slot for their whole timeout, so without it 1,000 of them at
    64 at once would keep the asker waiting 160 s. A host still being read then is
    cancelled (its commands' channels closed, and a connection opened for this read
    alone; a pooled one stays pooled, as after a per-host timeout, since a run may be
    using it) and one still waiting for a slot is not read; each gets a row saying so.
    The hosts read by then keep theirs (one whose GPUs were read, its health not yet,
    keeps its GPUs with the health read named as cut off)."""
    limit = settings.fleet.max_connections
    slots = asyncio.Semaphore(limit)
    keep = len(hosts) <= limit
    begun: set[int] = set()
    # Hosts whose GPUs are read, their health not yet: a cut-off health read costs the
    # health mark, not the GPUs' rows.
    gpus_read: dict[int, HostGpus] = {}
    start = time.monotonic()

    async def one(i: int, host: str) -> HostGpus:
        def read(row: HostGpus) -> None:
            gpus_read[i] = row

        async with slots:
            begun.add(i)
            return await query_host(settings, pool, host, timeout_s, keep=keep, on_gpus=read)

    def deadline_s() -> Awaitable[None]:
        return asyncio.sleep(settings.fleet.deadline_s)

    tasks = [asyncio.create_task(one(i, h)) for i, h in enumerate(hosts)]
    expired = asyncio.ensure_future((deadline or deadline_s)())
    try:
        if tasks:
            everyone = asyncio.ensure_future(asyncio.wait(tasks))
            await asyncio.wait({everyone, expired}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        expired.cancel()
        late = [t for t in tasks if not t.done()]
        for t in late:
            t.cancel()
        # Each cancelled read closes what it opened (a connection for this read alone,
        # its commands' channels) before the answer goes out.
        await asyncio.gather(*late, return_exceptions=True)
    waited = time.monotonic() - start
    return [
        t.result()
        if not t.cancelled()
        else _past_deadline(h, i in begun, settings, waited, gpus_read.get(i))
        for i, (h, t) in enumerate(zip(hosts, tasks, strict=True))
    ]


def _past_deadline(
    host: str, begun: bool, settings: Settings, waited_s: float, gpus: HostGpus | None
) -> HostGpus:
    """The row of a host the query's deadline cut off: no answer, as a timeout is; one
    whose GPUs were read by then keeps them, only its health unread."""
    limit = f"the query's deadline of {settings.fleet.deadline_s:g}s"
    if gpus is not None:
        return dataclasses.replace(
            gpus, health_error=f"no answer within {limit}", duration_s=waited_s
        )
    why = (
        f"no answer within {limit}"
        if begun
        else f"not read: {limit} passed before its turn "
        f"({settings.fleet.max_connections} hosts at once)"
    )
    return HostGpus(host, None, why, waited_s, unreachable=True)


# --------------------------------------------------------------------------- summary


def is_busy(gpu: Gpu) -> bool:
    return bool(gpu.processes) or (gpu.memory_used_mib or 0) > BUSY_MIB


@dataclass(frozen=True, slots=True)
class FleetCounts:
    hosts: int
    ok: int
    unreachable: int
    failed: int  # answered, but the GPU query failed (no driver, bad output)
    gpus: int
    busy: int
    used_mib: int | None  # None: a host or GPU did not report it
    total_mib: int | None
    critical: int = 0  # hosts with a critical GPU
    warn: int = 0  # hosts with a warning and no critical GPU

    @property
    def idle(self) -> int:
        return self.gpus - self.busy


def fleet_counts(results: Sequence[HostGpus]) -> FleetCounts:
    snaps = [r.snapshot for r in results if r.snapshot is not None]
    gpus = [g for s in snaps for g in s.gpus]
    unreachable = sum(1 for r in results if not r.ok and r.unreachable)
    levels = [r.health.level() for r in results if r.health is not None]
    return FleetCounts(
        hosts=len(results),
        ok=len(snaps),
        unreachable=unreachable,
        failed=len(results) - len(snaps) - unreachable,
        gpus=len(gpus),
        busy=sum(1 for g in gpus if is_busy(g)),
        used_mib=_sum(s.used_mib for s in snaps),
        total_mib=_sum(s.total_mib for s in snaps),
        critical=levels.count(Level.CRITICAL),
        warn=levels.count(Level.WARN),
    )


def _sum(values: Iterable[int | None]) -> int | None:
    known = list(values)
    return None if not known or None in known else sum(v for v in known if v is not None)


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value:,}"


def fleet_summary(results: Sequence[HostGpus]) -> str:
    """``62/64 hosts ok, 1 unreachable, 1 failed; 496 GPUs: 480 busy, 16 idle; ...``"""
    c = fleet_counts(results)
    problems = "".join(
        f", {n} {what}" for n, what in ((c.unreachable, "unreachable"), (c.failed, "failed")) if n
    )
    health = "".join(
        f", {n} {what}" for n, what in ((c.critical, "CRITICAL"), (c.warn, "with warnings")) if n
    )
    return (
        f"{c.ok}/{c.hosts} hosts ok{problems}{health}; {c.gpus} GPUs: {c.busy} busy, "
        f"{c.idle} idle; {_mib(c.used_mib)} of {_mib(c.total_mib)} MiB in use"
    )


def _problem(r: HostGpus) -> str:
    # UNAVAILABLE: the host answered, its GPUs did not (no driver, a bad nvidia-smi).
    return f"{'UNREACHABLE' if r.unreachable else 'UNAVAILABLE'}: {r.error}"


def render_fleet(results: Sequence[HostGpus]) -> str:
    """The summary, then every host's full per-GPU table (or why it has none)."""
    parts = [fleet_summary(results)]
    for r in results:
        if r.snapshot is None:
            parts.append(f"{r.host}: {_problem(r)}")
            continue
        table = render_table(r.snapshot, marks(r.health) if r.health is not None else None)
        parts.append(f"{table}\nhealth: {_health_line(r)}")
    return "\n\n".join(parts)


def _health_line(r: HostGpus) -> str:
    if r.health is None:
        return f"unknown ({r.health_error or 'not read'})"
    return r.health.summary()


def health_details(results: Sequence[HostGpus]) -> str:
    """``/vllm gpus <host> --health``: each GPU's verdict, findings and NVIDIA's action,
    and this boot's Xid lines."""
    parts = []
    for r in results:
        if r.health is not None:
            parts.append(details(r.health))
        else:
            why = _problem(r) if r.snapshot is None else f"health unknown: {r.health_error}"
            parts.append(f"{r.host}: {why}")
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- chat message


def _clean(text: str, width: int) -> str:
    # Host output ends up in a chat code block: no control characters, no backticks.
    text = "".join(ch if ch.isprintable() and ch != "`" else " " for ch in text)
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


_COLUMNS = (
    Column("HOST"),
    Column("GPUS", "right"),
    Column("BUSY", "right"),
    Column("UTIL", "right"),
    Column("USED MiB", "right"),
    Column("TOTAL MiB", "right"),
    Column("HEALTH"),
)


def _health_cell(r: HostGpus) -> str:
    if r.health is None:
        return "?"
    level = r.health.level()
    bad = [g.label.removeprefix("GPU ") for g in r.health.gpus if g.level == level]
    where = f" {','.join(bad)}" if bad and level != Level.OK else ""
    return {Level.OK: "ok", Level.WARN: "warn", Level.CRITICAL: "CRIT"}[level] + where


def _cells(r: HostGpus) -> tuple[str, ...]:
    s = r.snapshot
    assert s is not None
    utils = [g.utilization_pct for g in s.gpus if g.utilization_pct is not None]
    return (
        _clean(s.host, _HOST_WIDTH),
        str(len(s.gpus)),
        str(sum(1 for g in s.gpus if is_busy(g))),
        f"{sum(utils) // len(utils)}%" if utils else "n/a",
        _mib(s.used_mib),
        _mib(s.total_mib),
        _clean(_health_cell(r), 12),
    )


def _processes(s: GpuSnapshot) -> str:
    """``8: VLLM::Worker_TP* x8``: names that differ only in a trailing number count once."""
    if not s.processes:
        return "-"
    groups: dict[str, list[str]] = {}
    for p in sorted(s.processes, key=lambda p: -(p.used_mib or 0)):
        groups.setdefault(p.name.rstrip("0123456789") or p.name, []).append(p.name)
    return f"{len(s.processes)}: {', '.join(_group_label(k, n) for k, n in groups.items())}"


def _group_label(key: str, names: list[str]) -> str:
    if len(set(names)) > 1:
        return f"{key}* x{len(names)}"
    return names[0] if len(names) == 1 else f"{names[0]} x{len(names)}"


def host_lines(results: Sequence[HostGpus]) -> list[str]:
    """A header and one line per host (<= 100 characters), in the order given; a host
    without a snapshot gets the rest of its line for the reason."""
    lay = table.layout(_COLUMNS, [_cells(r) for r in results if r.snapshot is not None])
    room = max(lay.room(_ROW_LIMIT), 8)
    lines = [lay.header(_clean("PROCESSES", room))]
    for r in results:
        if r.snapshot is not None:
            lines.append(lay.line(_cells(r), _clean(_processes(r.snapshot), room)))
        else:
            name = _clean(r.host, _HOST_WIDTH).ljust(lay.widths[0])
            lines.append(_clean(f"{name}{_GAP}{_problem(r)}", _ROW_LIMIT))
    return lines


class FleetMessage(NamedTuple):
    text: str  # fits in ``max_chars``: post it (in a code block)
    attachment: str | None  # the full per-GPU tables, when ``text`` had to leave them out


def fleet_message(results: Sequence[HostGpus], *, max_chars: int = MESSAGE_CHARS) -> FleetMessage:
    """What to post for a fleet query within a chat message's size limit.

    The full per-GPU tables when they fit.  Otherwise the summary line and one line
    per host; and when even that is too long, the hosts with problems first, then as
    many others as fit, and a last line counting the rest.  Whenever something was
    left out, ``attachment`` holds the full tables (post it as a file).
    """
    if max_chars < _MIN_MESSAGE_CHARS:
        raise ValueError(f"max_chars must be at least {_MIN_MESSAGE_CHARS}")
    full = render_fleet(results)
    if len(full) <= max_chars:
        return FleetMessage(full, None)
    header, *rows = host_lines(results)
    summary = fleet_summary(results)
    text = "\n".join([summary, header, *rows])
    if len(text) <= max_chars:
        return FleetMessage(text, full)
    # Problem hosts are what a person scans for; the healthy rest fills what room is left.
    order = sorted(range(len(rows)), key=lambda i: results[i].ok)
    kept: list[int] = []
    size = len(summary) + 1 + len(header)
    for i in order:
        more = len(rows) - len(kept) - 1
        tail = f"\n… {more} more host{'s' if more != 1 else ''} in the attached file"
        if size + 1 + len(rows[i]) + (len(tail) if more else 0) > max_chars:
            break
        kept.append(i)
        size += 1 + len(rows[i])
    left = len(rows) - len(kept)
    lines = [summary, header, *(rows[i] for i in kept)]
    if left:
        lines.append(f"… {left} more host{'s' if left != 1 else ''} in the attached file")
    return FleetMessage("\n".join(lines), full)
