"""A host's GPUs as a fixed-width table, for a Slack code block or a terminal."""

from __future__ import annotations

from collections.abc import Mapping

from bot.core import table
from bot.core.gpu_snapshot import Gpu, GpuProcess, GpuSnapshot, all_processes
from bot.core.table import Column

LINE_LIMIT = 100
_NAME_WIDTH = 25
_COLUMNS = (
    Column("GPU", "right"),
    Column("NAME"),
    Column("USED MiB", "right"),
    Column("TOTAL MiB", "right"),
    Column("UTIL", "right"),
)
# Vendor boilerplate that makes every row wider without telling two GPUs apart.
_NAME_REWRITES = ((" Server Edition", " SE"), (" Workstation Edition", " WE"))


def short_gpu_name(name: str) -> str:
    """'NVIDIA RTX PRO 6000 Blackwell Server Edition' -> 'RTX PRO 6000 Blackwell SE'."""
    short = name.removeprefix("NVIDIA ").strip()
    for long, abbreviation in _NAME_REWRITES:
        short = short.replace(long, abbreviation)
    return _fit(short or name.strip(), _NAME_WIDTH)


def _fit(text: str, width: int) -> str:
    return table.cut(_printable(text), width)


def _printable(text: str) -> str:
    # Process names come from the host: a control character could drive a terminal,
    # and a backtick could close the Slack code block the table is posted in.
    return "".join(ch if ch.isprintable() and ch != "`" else "?" for ch in text)


def _mib(value: int | None) -> str:
    return "n/a" if value is None else str(value)


def _pct(value: int | None) -> str:
    return "n/a" if value is None else f"{value}%"


def _process_cell(proc: GpuProcess, width: int) -> str:
    head, tail = str(proc.pid), "n/a" if proc.used_mib is None else f"{proc.used_mib} MiB"
    name_width = max(width - len(head) - len(tail) - 2, 4)
    return f"{head} {_fit(proc.name, name_width)} {tail}"


def _gpu_label(snapshot: GpuSnapshot, gpu: Gpu, health: Mapping[str, str] | None) -> str:
    label = str(gpu.index) if snapshot.in_scope(gpu) else f"({gpu.index})"
    mark = (health or {}).get(gpu.uuid, "")
    return f"{label} {mark}" if mark else label


def render_table(snapshot: GpuSnapshot, health: Mapping[str, str] | None = None) -> str:
    """A fixed-width table for a Slack code block or a terminal, lines <= ``LINE_LIMIT``.

    One row per GPU (extra processes continue on following rows), processes that
    match no GPU under ``?``, then a total row over the GPUs in scope.  A GPU outside
    the snapshot's scope (another service's) shows its index in parentheses and counts
    in no total.  ``health``: a short mark per GPU uuid ("warn", "CRIT") shown after
    its index.  A value nobody reported reads ``n/a``, never 0.  No trailing spaces.
    """
    count = len(snapshot.gpus)
    header = _fit(f"{snapshot.host}: {count} GPU{'s' if count != 1 else ''}", LINE_LIMIT)
    if not snapshot.gpus and not snapshot.processes:
        return f"{header}, nothing reported"
    known = {g.uuid for g in snapshot.gpus}
    stray = tuple(p for p in all_processes(snapshot) if p.gpu_uuid not in known)
    rows: list[tuple[tuple[str, ...], tuple[GpuProcess, ...]]] = []
    for gpu in snapshot.gpus:
        gpu_cells = (
            _gpu_label(snapshot, gpu, health),
            short_gpu_name(gpu.name),
            _mib(gpu.memory_used_mib),
            _mib(gpu.memory_total_mib),
            _pct(gpu.utilization_pct),
        )
        rows.append((gpu_cells, gpu.processes))
    for proc in stray:
        rows.append((("?", _fit(proc.gpu_uuid, _NAME_WIDTH), "", "", ""), (proc,)))
    utils = [g.utilization_pct for g in snapshot.scoped_gpus if g.utilization_pct is not None]
    total_cells = (
        "",
        "total",
        _mib(snapshot.used_mib),
        _mib(snapshot.total_mib),
        _pct(sum(utils) // len(utils) if utils else None),
    )
    n_procs = sum(len(p) for _, p in rows)

    lay = table.layout(_COLUMNS, [*(cells for cells, _ in rows), total_cells])
    room = lay.room(LINE_LIMIT)
    out = [header, lay.header("PROCESSES")]
    for cells, procs in rows:
        out.append(lay.line(cells, _process_cell(procs[0], room) if procs else ""))
        out.extend(lay.line(("",) * 5, _process_cell(p, room)) for p in procs[1:])
    out.append(lay.line(total_cells, f"{n_procs} process{'es' if n_procs != 1 else ''}"))
    if any(not snapshot.in_scope(g) for g in snapshot.gpus):
        out.append(
            "(n): another service's GPU, outside the total; what runs there never blocks this drain"
        )
    return "\n".join(out)
