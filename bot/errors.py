"""One error tree for the whole bot.

Every error the engine raises on purpose is a ``ChatOpsError``; the CLI and the
Slack handlers translate these into one clear sentence for a person, so the
message text is written for the operator, never for a developer.
"""

from __future__ import annotations


class ChatOpsError(Exception):
    """Base of every error the bot raises deliberately."""


class ConfigError(ChatOpsError):
    """The configuration file or environment is invalid; names the key and the problem."""


class InputError(ChatOpsError):
    """A command typed by a user does not fit the grammar; the text lists what is valid."""


class NotConfirmed(ChatOpsError):
    """The operator was asked on a terminal and answered no: nothing was done, as for a
    cancel (the terminal's exit code 5), not a mistake of theirs."""


class RefusedError(ChatOpsError):
    """A request is well-formed but not allowed (policy, channel, lock held)."""


class LockHeldError(RefusedError):
    """Another maintenance job holds the service or host."""

    def __init__(self, message: str, *, run_id: int, requested_by: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.requested_by = requested_by


class AuditError(ChatOpsError):
    """The audit database cannot be opened or written."""


class AuditUnavailable(AuditError):
    """The audit database cannot be written *for now*: locked or busy past the timeout,
    full, an I/O error, read-only, or (PostgreSQL) down, restarting or failing over.
    The resilient writer keeps such writes in its fallback journal
    (``bot.audit.resilient``); any other ``AuditError`` is a bug or a refusal."""


class FencedError(AuditError):
    """This process no longer owns the run it wrote for: another process recovered it
    (its lease lapsed: a pause, a freeze, a lost network), so the run's epoch moved on
    (issue 21). The writer must stop driving the run; nothing of it was written."""


class RunNotFoundError(ChatOpsError):
    """No run with that id exists in the audit log."""


class HostError(ChatOpsError):
    """Something went wrong talking to a GPU host."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host
        self.reason = message


class HostKeyError(HostError):
    """The host's SSH key is unknown or changed: strict checking refused it."""


class HostUnreachableError(HostError):
    """TCP connect, SSH handshake or authentication failed, or the connection died."""


class GpuQueryError(HostError):
    """nvidia-smi or NVML failed; carries the exit status and output."""

    def __init__(
        self, host: str, message: str, *, exit_status: int | None = None, output: str = ""
    ) -> None:
        super().__init__(host, message)
        self.exit_status = exit_status
        self.output = output
