"""Live progress of a run in a terminal: one more sink of the engine's events; and
``visible``, which every writer of the command line passes host text through."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO, assert_never

from bot.core import events as ev
from bot.core.gpu import render_table
from bot.core.packages import change_report
from bot.core.plan import STEP_TITLES
from bot.core.redact import (
    BASE64_TOKEN,
    MASK,
    ends_in_full_key_token,
    random_looking,
    split_token,
    token_shape,
)
from bot.core.status import StepStatus
from bot.core.versions import change_text

# Issue 17 F7: text from a host (a /v1/models id, a process name, uv's or the journal's
# output) reaches the operator's terminal, and a terminal obeys control characters: ESC
# sequences (ESC[2K\r rewrote the status line), BEL, a CR that overwrites the line, C1
# controls (U+009B is a one-byte CSI), and bidirectional overrides and isolates that
# reorder what is shown (U+202A-U+202E, U+2066-U+2069), with the marks that steer them
# (U+200E, U+200F, U+061C). Tab and newline are layout and stay.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\r":
        return "\\r"
    code = ord(char)
    # \xNN for C0 (as Python and most tools write them); \uNNNN for the rest, which is
    # also how JSON writes them, so `--json` output stays valid JSON meaning the same.
    return f"\\x{code:02x}" if code < 0x20 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control character and bidi override written out (ESC as
    ``\\x1b``, U+202E as ``\\u202e``) instead of acting on the terminal: shown, not
    dropped, so the evidence stays."""
    return _CONTROLS.sub(_shown, text)


def say(out: TextIO, text: str) -> None:
    """Write one line of text that may hold a host's words."""
    out.write(visible(text) + "\n")
    out.flush()


# Output streams line by line, so a private key's body lines never reach the redactor
# together with its BEGIN line: the sink masks every line between the two markers.  (The
# Redactor's own tests of a key line are imported, so the two agree on what one is.)
_KEY_BEGIN = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
_KEY_END = re.compile(r"-----END [A-Z0-9 ]*PRIVATE KEY-----")
# Without its BEGIN line (a tailed output), a key's full-width body lines are masked one
# by one, but its short last line looks like any word until the next line comes: such a
# line is held back until then (or until any other event, which must not print first).
# Shorter random-looking pieces are too short to matter.
_MIN_LONE_PIECE = 8


@dataclass(frozen=True, slots=True)
class _Held:
    """An output line that may be the last line of a key, waiting for the next one."""

    where: tuple[str, str]
    host: str
    prefix: str
    token: str
    line: str
    after_key: bool  # it follows a key body line in its stream

    def is_key(self, following: str | None) -> bool:
        """``following``: the next line of its stream; None when the stream ended (or
        another stream's line, or any event but output, came: one line at most is held,
        and never past an event printed after it)."""
        if following is None:
            return self.after_key
        if _KEY_END.search(following) or ends_in_full_key_token(following):
            return True
        # What the Redactor masks in a whole text: a random piece right after key lines.
        return self.after_key and random_looking(self.token)


class TerminalSink:
    def __init__(
        self,
        out: TextIO | None = None,
        *,
        show_output: bool = True,
        redact: Callable[[str], str] | None = None,
    ) -> None:
        self.out = out or sys.stdout
        self.show_output = show_output
        self._redact: Callable[[str], str] = redact or (lambda s: s)
        self._in_key: set[tuple[str, str]] = set()
        # Streams whose last line was a key body line: the shape of its log prefix.
        self._key_line: dict[tuple[str, str], str] = {}
        self._held: _Held | None = None
        # Runs that only look (--dry-run): their end says nothing changed, not a version.
        self._dry_runs: set[int] = set()

    def _print(self, text: str) -> None:
        say(self.out, self._redact(text))

    def _packages(self, event: ev.PackagesKnown) -> None:
        report = change_report(event.kind, event.diff, event.note)
        if report is not None:
            self._print("\n".join(f"[{event.host}] {line}" for line in report.splitlines()))

    def _gpu_table(self, event: ev.GpuTable) -> None:
        self._print(f"[{event.host}] GPU memory {event.label}:\n{render_table(event.snapshot)}")

    async def handle(self, event: ev.Event) -> None:
        self._streams_end(event)
        match event:
            case ev.PackagesKnown():
                self._packages(event)
            case ev.GpuTable():
                self._gpu_table(event)
            case ev.RunStarted():
                self._started(event)
            case ev.StepStarted():
                self._print(f"[{event.host}] > {STEP_TITLES[event.step]}: {event.command}")
            case ev.StepProgress():
                # The flow sends progress when it changes, and at most every few seconds.
                self._print(f"[{event.host}]   ~ {event.shown()}")
            case ev.OutputLine():
                self._output(event)
            case ev.StepFinished():
                self._finished(event)
            case ev.HostFinished():
                self._print(f"[{event.host}] {event.status}: {event.summary}")
            case ev.RunFinished():
                self._print(
                    f"run #{event.run_id} {event.status.upper()}"
                    f"{self._versions(event)}: {event.summary}"
                )
            case ev.Notice() | ev.RotationChanged():
                self._print(self._said(event))
            case ev.VersionsKnown() | ev.GpuHealthKnown() | ev.ReleaseSwitched():
                # The versions are in the run's closing line; a GPU health verdict is
                # read for an approval card, which a terminal run does not have; a
                # release switch is its step's line.
                pass
            case _:
                assert_never(event)

    @staticmethod
    def _said(event: ev.Notice | ev.RotationChanged) -> str:
        """A line about the run that is no step of it: a notice, a rotation change."""
        match event:
            case ev.Notice():
                return f"run #{event.run_id}: ! {event.text}"
            case ev.RotationChanged():
                where = f"router {event.router}, server {event.server}"
                if event.held:
                    return f"[{event.host}] {event.detail} ({where})"
                if not event.ok:
                    return (
                        f"[{event.host}] ! rotation {event.change} failed ({where}): {event.detail}"
                    )
                moved = "out of rotation" if event.change == "out" else "back in rotation"
                return f"[{event.host}] {moved} ({where})"
            case _:
                assert_never(event)

    def _started(self, event: ev.RunStarted) -> None:
        p = event.plan
        if p.dry_run:
            self._dry_runs.add(event.run_id)
        what = p.spec + (f" from index {p.index_name}" if p.index_name else "")
        self._print(
            f"run #{event.run_id}: {p.action} {p.service} on {', '.join(p.hosts)}"
            f" ({what}) requested by {event.requested_by}"
            + (f", approved by {', '.join(event.approved_by)}" if event.approved_by else "")
        )

    def _versions(self, event: ev.RunFinished) -> str:
        """What the run's closing line says of the version: a dry run installs nothing, so
        it has no version after (it is not 'None')."""
        if event.run_id in self._dry_runs:
            self._dry_runs.discard(event.run_id)
            return " (dry run: nothing changed)"
        change = change_text(event.version_before, event.version_after)
        return f" (version {change})" if change is not None else ""

    def _finished(self, event: ev.StepFinished) -> None:
        mark = event.status if event.status == StepStatus.OK else "FAILED"
        self._print(
            f"[{event.host}] {mark} {event.step} ({event.duration_s:.1f}s): {event.summary}"
        )
        self._in_key.discard((event.host, event.step))
        self._key_line.pop((event.host, event.step), None)
        if event.status != StepStatus.OK and event.output.strip():
            # Redact the whole output before cutting, so a cut never hides a secret's start.
            tail = self._redact(event.output).strip().splitlines()[-50:]
            self._print("\n".join(f"[{event.host}]   ! {line}" for line in tail))

    def _output(self, event: ev.OutputLine) -> None:
        if not self.show_output:
            return
        self._settle(event)
        shown = self._mask_keys(event)
        if shown is not None:
            self._print(f"[{event.host}]   | {shown}")

    def _streams_end(self, event: ev.Event) -> None:
        # A held line waits for the next output line only: any other event (a progress
        # line, a notice, a table, a step's end) is printed after it, never before, so
        # it is settled now as at the end of its stream.
        if not isinstance(event, ev.OutputLine):
            self._settle(None)

    def close(self) -> None:
        """Settle the line held back, if any: the run ended without a last event (the
        engine raised), so the line is printed (masked if it ends a key) all the same.
        The callers that drive a run call this in a ``finally``."""
        self._settle(None)

    def _settle(self, following: ev.OutputLine | None) -> None:
        """Print the held line, masked if what follows it makes it a key's line."""
        held, self._held = self._held, None
        if held is None:
            return
        line = (
            following.line
            if following is not None and (following.host, str(following.step)) == held.where
            else None
        )
        self._print(
            f"[{held.host}]   | " + (held.prefix + MASK if held.is_key(line) else held.line)
        )

    def _mask_keys(self, event: ev.OutputLine) -> str | None:
        """The line as shown, or None when it is held back (see ``_Held``)."""
        where = (event.host, str(event.step))
        if where in self._in_key:
            if _KEY_END.search(event.line):
                self._in_key.discard(where)
            return MASK
        if _KEY_BEGIN.search(event.line) and not _KEY_END.search(event.line):
            self._in_key.add(where)
            return event.line
        prefix, token = split_token(event.line)
        if ends_in_full_key_token(event.line):
            self._key_line[where] = token_shape(prefix)
            return prefix + MASK
        after_key = self._key_line.pop(where, None) == token_shape(prefix)
        if BASE64_TOKEN.fullmatch(token) and (
            after_key or (len(token) >= _MIN_LONE_PIECE and random_looking(token))
        ):
            self._held = _Held(where, event.host, prefix, token, event.line, after_key)
            return None
        return event.line
