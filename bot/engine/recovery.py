"""After a restart: close the runs a dead process left behind, and say what that means.

``recover`` marks every run whose owning process is gone ``interrupted`` (with
the step it was in; see ``AuditLog.recover_interrupted``) and returns, per run,
the sentence to post in its Slack thread: what state the service may be in
after stopping at that step, and what to run next.  Runs owned by a live
process (another bot or a CLI on the same database) are left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bot.audit.store import AuditLog, RunRecord
from bot.core.plan import Step
from bot.engine.owner import owner_alive


@dataclass(frozen=True, slots=True)
class Interrupted:
    run: RunRecord
    message: str  # for the run's thread (and the terminal)


# What the service may look like when the bot stopped during each step.
_STATE_AFTER: dict[str, str] = {
    Step.PREFLIGHT: "Nothing was changed: the bot stopped before stopping the service, "
                    "so it should still be running.",
    Step.STATUS: "Nothing was changed: it was a read-only status query.",
    Step.STOP: "The service may be running, stopping or stopped: `systemctl stop` may "
               "have been sent.",
    Step.DRAIN: "The service was stopped and nothing was reinstalled; it is probably still "
                "STOPPED.",
    Step.REINSTALL: "The service is STOPPED, and the reinstall may have completed, failed "
                    "or still be running on the host (a bot restart does not stop `uv`).",
    Step.ROLLBACK: "The service is STOPPED, and the rollback may have completed, failed or "
                   "still be running on the host (a bot restart does not stop `uv`).",
    Step.START: "The service may be starting, running or failed: `systemctl start` may have "
                "been sent.",
    Step.ROLLBACK_START: "The previous version was reinstalled; the service may be starting, "
                        "running or failed.",
    Step.HEALTH: "The service was started but had not yet passed the health gate.",
    Step.ROLLBACK_HEALTH: "The previous version was reinstalled and started but had not yet "
                          "passed the health gate.",
    Step.POSTCHECK: "The service had passed the health gate; only the post-check was left.",
}


def interrupted_message(run: RunRecord) -> str:
    """The sentence for an interrupted run's thread: where it stopped, what the service
    may look like, what to run next."""
    if run.started_at is None:
        return (f"Run #{run.id} ({run.action} {run.service}) was approved, but the bot "
                "restarted before it began; nothing was changed. Request it again if it is "
                "still needed.")
    step = run.current_step
    where = f"during step `{step}`" if step else "before its first step"
    state = _STATE_AFTER.get(step or Step.PREFLIGHT,
                             "The state of the service is unknown.")
    return (f"Run #{run.id} ({run.action} {run.service}) was interrupted: the bot stopped "
            f"{where}. {state} Check with `/vllm status {run.service}` before doing "
            "anything else.")


async def recover(audit: AuditLog,
                  alive: Callable[[str | None], bool] = owner_alive) -> list[Interrupted]:
    """Mark the runs of dead processes interrupted; one message per run, oldest first."""
    return [Interrupted(run, interrupted_message(run))
            for run in await audit.recover_interrupted(alive)]
