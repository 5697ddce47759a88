"""Whether a host's GPUs are drained: free enough to start vLLM on, and if not, who holds
them (``drain_verdict``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bot.core.gpu_snapshot import GpuSnapshot, all_processes

HolderKind = Literal["process", "memory", "worker", "missing"]


@dataclass(frozen=True, slots=True)
class Holder:
    """One reason a host is not drained.

    ``process``: a compute app holds memory on a GPU (``gpu_index`` is None when
    its uuid matches no GPU).  ``memory``: a GPU is above the threshold (or does not
    report its memory) with no process listed.  ``worker``: a ``VLLM::`` process
    from pgrep is still alive but nvidia-smi lists it on no GPU.  ``missing``: nvidia-smi
    lists none of the GPUs in scope (a drain over no GPU must never pass).
    """

    kind: HolderKind
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    pid: int | None = None
    name: str = ""
    used_mib: int | None = None

    def describe(self) -> str:
        where = f"GPU {self.gpu_index}" if self.gpu_index is not None else f"GPU {self.gpu_uuid}"
        if self.kind == "worker":
            return f"PID {self.pid} ({self.name}) is still running"
        if self.kind == "missing":
            return "nvidia-smi lists no GPU of this service, so none can be confirmed free"
        if self.kind == "memory":
            if self.used_mib is None:
                return f"{where}: memory use not reported, cannot confirm it is free"
            return f"{where}: {self.used_mib} MiB used, no process listed"
        amount = f"{self.used_mib} MiB" if self.used_mib is not None else "memory"
        return f"{where}: {amount} held by PID {self.pid} ({self.name})"


@dataclass(frozen=True, slots=True)
class DrainVerdict:
    drained: bool
    threshold_mib: int
    holders: tuple[Holder, ...] = ()
    # GPUs judged by their processes alone (they report no memory figure: unified memory).
    by_processes: tuple[int, ...] = ()

    def describe(self) -> str:
        if self.drained and self.by_processes:
            gpus = ", ".join(str(i) for i in self.by_processes)
            return (
                f"drained: no compute process and no vLLM worker of the service; GPU"
                f"{'s' if len(self.by_processes) != 1 else ''} {gpus} report no memory "
                "figure (unified memory), so the drain was judged by processes alone"
            )
        if self.drained:
            return f"drained: no GPU process, every GPU at or below {self.threshold_mib} MiB"
        # No "not drained" prefix: callers put this after their own "still held: ".
        return "; ".join(h.describe() for h in self.holders)


def drain_verdict(
    snapshot: GpuSnapshot,
    threshold_mib: int,
    workers: Sequence[tuple[int, str]] = (),
) -> DrainVerdict:
    """Decide whether the GPUs in the snapshot's scope are free enough to start vLLM.

    Drained means: no compute app holds memory on them, every one of them is at or
    below ``threshold_mib`` (the driver keeps a little per GPU), and none of
    ``workers`` (the service's ``VLLM::`` processes, from ``parse_pgrep``) survives.
    Memory that cannot be read counts as held: starting on a GPU we cannot see is how
    a redeploy ends in an out-of-memory. A GPU that reports no memory figure by
    design (unified memory) is judged by its processes alone, and the verdict says so.
    Processes on GPUs outside the scope never block; a scope with no GPU never drains.
    """
    gpus = snapshot.scoped_gpus
    index_of = {g.uuid: g.index for g in snapshot.gpus}
    holders: list[Holder] = []
    held_gpus: set[str] = set()
    listed_pids: set[int] = set()
    for proc in all_processes(snapshot):
        if proc.gpu_uuid in index_of and proc.gpu_uuid not in {g.uuid for g in gpus}:
            listed_pids.add(proc.pid)  # another service's GPU: shown, never blocking
            continue
        if proc.used_mib == 0:
            continue
        holders.append(
            Holder(
                "process",
                index_of.get(proc.gpu_uuid),
                proc.gpu_uuid,
                proc.pid,
                proc.name,
                proc.used_mib,
            )
        )
        held_gpus.add(proc.gpu_uuid)
        listed_pids.add(proc.pid)
    by_processes = []
    for gpu in gpus:
        used = gpu.memory_used_mib
        if gpu.uuid in held_gpus:
            continue
        if gpu.memory_not_reported:
            by_processes.append(gpu.index)
        elif used is None or used > threshold_mib:
            holders.append(Holder("memory", gpu.index, gpu.uuid, used_mib=used))
    for pid, command in workers:
        if pid not in listed_pids:
            holders.append(Holder("worker", pid=pid, name=command))
            listed_pids.add(pid)
    if not gpus:
        holders.append(Holder("missing"))
    holders.sort(key=_holder_order)
    return DrainVerdict(
        drained=not holders,
        threshold_mib=threshold_mib,
        holders=tuple(holders),
        by_processes=tuple(by_processes),
    )


def _holder_order(h: Holder) -> tuple[int, int, int]:
    # GPUs in index order, then unknown GPUs, then stray workers: how people read nvidia-smi.
    rank = 0 if h.gpu_index is not None else (1 if h.kind not in ("worker", "missing") else 2)
    return (rank, h.gpu_index if h.gpu_index is not None else 0, h.pid or 0)
