"""Process-wide logging with every record passed through the Redactor.

Log lines carry exception text from Slack and SSH libraries, which may quote a
token or a URL with credentials; the audit log and Slack are redacted at their
own boundaries, and this is the boundary for logs.  The filter sits on the
handler (a logger's filters do not see records propagated from child loggers),
renders the message with its args, and renders the traceback too, so a secret
inside an exception message is masked before any formatter sees it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TextIO

Redact = Callable[[str], str]
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# asyncssh logs every connection and channel at INFO: hundreds of lines per redeploy.
QUIET_LOGGERS = ("asyncssh",)


class RedactingFilter(logging.Filter):
    """Masks secrets in the message, its args and the exception/stack text of a record."""

    def __init__(self, redact: Redact) -> None:
        super().__init__()
        self.redact = redact
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad format: keep both parts, masked
            message = f"{record.msg} {record.args!r}"
        record.msg = self.redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            # Formatters use exc_text when it is set, so the raw traceback never shows.
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


_installed: logging.Handler | None = None


def setup_logging(
    redact: Redact, *, level: int = logging.INFO, stream: TextIO | None = None
) -> logging.Handler:
    """Log to ``stream`` (stderr) through the redacting filter. Calling it again
    replaces the handler it installed before (e.g. once the secrets are known)."""
    global _installed
    root = logging.getLogger()
    if _installed is not None:
        root.removeHandler(_installed)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    handler.addFilter(RedactingFilter(redact))
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    _installed = handler
    return handler
