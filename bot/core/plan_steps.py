"""The steps a run can take, their titles on the card, and one planned step with the
command it will run (re-exported by ``bot.core.plan``, where the plans are built)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Step(StrEnum):
    PREFLIGHT = "preflight"
    REQUESTS = "requests"
    STOP = "stop"
    DRAIN = "drain"
    REINSTALL = "reinstall"
    START = "start"
    HEALTH = "health"
    READINESS = "readiness"
    POSTCHECK = "postcheck"
    ROLLBACK = "rollback"
    ROLLBACK_START = "rollback_start"
    ROLLBACK_HEALTH = "rollback_health"
    ROLLBACK_READINESS = "rollback_readiness"
    STATUS = "status"
    # Issue 10: the whole environment.
    PREFETCH = "prefetch"
    GATE = "gate"
    ROLLBACK_STOP = "rollback_stop"
    # Issue 12: GPU hardware health, per-service GPUs, leftover workers.
    GPU_CHECK = "gpu_check"
    LEFTOVERS = "leftovers"
    GPU_RECHECK = "gpu_recheck"
    # Issue 19: a replica taken out of its router's rotation and put back.
    ROTATION_OUT = "rotation_out"
    ROTATION_IN = "rotation_in"
    ROTATION = "rotation"  # the read-only `rotation` command
    # Issue 20: the watch window after the start.
    WATCH = "watch"
    # Issue 20, item 3: side-by-side releases.
    BUILD = "build"
    SWITCH = "switch"
    ROLLBACK_SWITCH = "rollback_switch"
    PRUNE = "prune"
    # Issue 23: host maintenance (reboot, GPU reset) and its deep GPU check.
    REBOOT = "reboot"
    GPU_RESET = "gpu_reset"
    DEEP_CHECK = "deep_check"


STEP_TITLES: dict[Step, str] = {
    Step.PREFLIGHT: "Preflight (unit, version, disk, install dry run, environment snapshot)",
    Step.PREFETCH: "Prefetch packages into uv's cache, then the import and CUDA gate in that "
    "new environment (before the stop)",
    Step.REQUESTS: "Drain in-flight requests",
    Step.STOP: "Stop service",
    Step.DRAIN: "Verify GPU memory drained",
    Step.REINSTALL: "Reinstall package",
    Step.GATE: "Import gate (vllm, torch, CUDA vs driver)",
    Step.START: "Start service",
    Step.HEALTH: "Health gate",
    Step.READINESS: "Readiness (model, smoke test, version)",
    Step.POSTCHECK: "Post-check (version, GPUs)",
    Step.ROLLBACK_STOP: "Rollback: stop the unhealthy service",
    Step.ROLLBACK: "Rollback: restore the environment snapshot",
    Step.ROLLBACK_START: "Rollback: start service",
    Step.ROLLBACK_HEALTH: "Rollback: health gate",
    Step.ROLLBACK_READINESS: "Rollback: readiness",
    Step.STATUS: "Status",
    Step.GPU_CHECK: "GPU check (count, ECC, row remaps, reset status, Xid errors)",
    Step.LEFTOVERS: "Terminate leftover processes (approved)",
    Step.GPU_RECHECK: "Post-check: GPU health (new Xid errors)",
    Step.WATCH: "Watch window (unit, journal, health, smoke) after the start",
    Step.BUILD: "Build the new release beside the live one, then the import and CUDA gate "
    "with its own interpreter (before the stop)",
    Step.SWITCH: "Switch the venv's link to the new release",
    Step.ROLLBACK_SWITCH: "Rollback: switch the venv's link back to the previous release",
    Step.PRUNE: "Prune old releases (never the live or the previous one)",
    Step.ROTATION_OUT: "Out of rotation (router), until no session is left",
    Step.ROTATION_IN: "Back in rotation (router), confirmed serving",
    Step.ROTATION: "Each replica in or out of rotation (router), its sessions and health",
    Step.REBOOT: "Reboot, then wait for SSH with the same host key and a new boot id",
    Step.GPU_RESET: "Reset the GPUs (persistence mode off for it, then restored)",
    Step.DEEP_CHECK: "Deep GPU check (PCIe, throttling, driver, count, DCGM, health)",
}


@dataclass(frozen=True, slots=True)
class PlannedStep:
    step: Step
    command: str  # what an operator would type, shown on the card and in the audit log
