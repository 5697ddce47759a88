"""The words a run, a step and a host outcome can be in, as types.

Every status the bot stores, compares or shows comes from here: a typo is a type
error, not a run that silently never matches. They are ``StrEnum`` so the values
stored in SQLite and printed by ``audit --json`` stay the plain words they always
were (``RunStatus.RUNNING == "running"``), and a database written by an older bot
reads back unchanged.
"""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    """Where a run is in its life; see ``bot.engine.lifecycle`` for who moves it."""

    PENDING_APPROVAL = "pending_approval"
    APPROVED = "approved"
    # Issue 22: approved for a later start (``--at``); nothing drives it and it holds no
    # locks until the scheduler claims it (bot.engine.schedule).
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    ABORTED = "aborted"  # stopped before anything on a host changed
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"  # its driver died or was stopped mid-run
    DENIED = "denied"
    EXPIRED = "expired"
    REFUSED = "refused"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


ACTIVE_STATUSES: frozenset[RunStatus] = frozenset(
    {RunStatus.PENDING_APPROVAL, RunStatus.APPROVED, RunStatus.SCHEDULED, RunStatus.RUNNING}
)
FINAL_STATUSES: frozenset[RunStatus] = frozenset(set(RunStatus) - ACTIVE_STATUSES)


class HostStatus(StrEnum):
    """How one host's flow ended (``HostOutcome.status``), or that it never began."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
    CANCELLED = "cancelled"
    ABORTED = "aborted"
    NOT_STARTED = "not_started"  # a rollout stopped before it reached this host


class StepStatus(StrEnum):
    """A step as the audit log and the card's checklist know it."""

    PENDING = "pending"  # planned, not begun (cards only; never stored)
    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    SKIPPED = "skipped"
    INTERRUPTED = "interrupted"


STORED_STEP_STATUSES: frozenset[StepStatus] = frozenset(set(StepStatus) - {StepStatus.PENDING})


class Action(StrEnum):
    """What a run does to a service."""

    REDEPLOY = "redeploy"
    RESTART = "restart"
    STATUS = "status"
    # Issue 19: one replica's place in its router's rotation, read (ROTATION) or
    # changed by hand (DRAIN: out, UNDRAIN: back in); the service itself is not touched.
    ROTATION = "rotation"
    DRAIN = "drain"
    UNDRAIN = "undrain"
    # Issue 20, item 3: a side-by-side service switched back to its previous release.
    ROLLBACK = "rollback"
    # Issue 23: a whole host's maintenance: every service on it drained and stopped, the
    # host rebooted or its GPUs reset, the deep GPU check, the services started again.
    REBOOT = "reboot"
    GPU_RESET = "gpu_reset"

    @property
    def read_only(self) -> bool:
        """It changes nothing: approved by the system, no locks, anyone may ask."""
        return self in (Action.STATUS, Action.ROTATION)

    @property
    def one_host(self) -> bool:
        """It names one host of the service (``drain|undrain <service> <host>``)."""
        return self in (Action.DRAIN, Action.UNDRAIN)

    @property
    def host_wide(self) -> bool:
        """It works on one host and every service on it (``host reboot|gpu-reset``)."""
        return self in (Action.REBOOT, Action.GPU_RESET)


class Decision(StrEnum):
    """What a person (or a system approver) decided about a run."""

    APPROVE = "approve"
    DENY = "deny"
    CANCEL = "cancel"
    RECOVER = "recover"  # marked a run of a dead driver interrupted (bot.engine.recovery)
    # Let a running run terminate the processes that outlived its service's stop.
    TERMINATE = "terminate"


class Source(StrEnum):
    """Where a request came from."""

    SLACK = "slack"
    CLI = "cli"
    DEMO = "demo"


class HealthSource(StrEnum):
    """What a GPU check read the GPUs' state with (ECC, pending pages and row remaps,
    recovery action): NVML on a host the bot runs on, ``nvidia-smi -q`` otherwise and
    where NVML cannot be used."""

    NVML = "NVML"
    NVIDIA_SMI = "nvidia-smi -q"
