"""The terminal sink: what an operator sees, and what it must never show."""

from __future__ import annotations

import io

from bot.cli.terminal import TerminalSink
from bot.core import events as ev
from bot.core.plan import Step
from bot.core.redact import Redactor
from bot.core.status import StepStatus

KEY_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"


async def test_a_private_key_streamed_line_by_line_is_masked() -> None:
    out = io.StringIO()
    sink = TerminalSink(out, redact=Redactor())
    lines = ["Resolved 152 packages", "-----BEGIN OPENSSH PRIVATE KEY-----", KEY_BODY,
             KEY_BODY[::-1], "-----END OPENSSH PRIVATE KEY-----", "Installed 1 package"]
    for line in lines:
        await sink.handle(ev.OutputLine(1, "gpu-node-1", Step.REINSTALL, "stderr", line))
    await sink.handle(ev.StepFinished(1, "gpu-node-1", Step.REINSTALL, StepStatus.FAILED, 2, 1.0,
                                      "reinstall failed", "\n".join(lines)))
    text = out.getvalue()
    assert KEY_BODY not in text and KEY_BODY[::-1] not in text
    assert "Resolved 152 packages" in text and "Installed 1 package" in text
    # Output after the block shows again.
    assert text.count("Installed 1 package") == 2
