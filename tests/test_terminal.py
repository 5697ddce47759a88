"""The terminal sink: what an operator sees, and what it must never show."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bot.cli.main import run_change
from bot.cli.terminal import TerminalSink, visible
from bot.core import events as ev
from bot.core.plan import Step
from bot.core.redact import MASK, Redactor
from bot.core.service_state import ServiceState
from bot.core.status import Action, RunStatus, StepStatus
from bot.engine.engine import RunResult
from bot.engine.leftover_gate import LeftoverGate
from bot.engine.runtime import open_runtime
from bot.sim.kit import SERVICE, SimKit
from tests.support.cli import cli, write_toml
from tests.support.sim import sim_settings

KEY_BODY = "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ"


async def test_a_private_key_streamed_line_by_line_is_masked() -> None:
    out = io.StringIO()
    sink = TerminalSink(out, redact=Redactor())
    lines = [
        "Resolved 152 packages",
        "-----BEGIN OPENSSH PRIVATE KEY-----",
        KEY_BODY,
        KEY_BODY[::-1],
        "-----END OPENSSH PRIVATE KEY-----",
        "Installed 1 package",
    ]
    for line in lines:
        await sink.handle(ev.OutputLine(1, "gpu-node-1", Step.REINSTALL, "stderr", line))
    await sink.handle(
        ev.StepFinished(
            1,
            "gpu-node-1",
            Step.REINSTALL,
            StepStatus.FAILED,
            2,
            1.0,
            "reinstall failed",
            "\n".join(lines),
        )
    )
    text = out.getvalue()
    assert KEY_BODY not in text and KEY_BODY[::-1] not in text
    assert "Resolved 152 packages" in text and "Installed 1 package" in text
    # Output after the block shows again.
    assert text.count("Installed 1 package") == 2


def _real_keys(tmp: Path) -> dict[str, str]:
    """Keys made by the tools an operator uses, so line lengths and last lines are real."""
    if not (shutil.which("ssh-keygen") and shutil.which("openssl")):
        pytest.skip("needs ssh-keygen and openssl")
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "issue9", "-f", str(tmp / "ed25519")],
        check=True,
        capture_output=True,
    )
    rsa = subprocess.run(
        ["openssl", "genrsa", "-traditional", "2048"], check=True, capture_output=True, text=True
    ).stdout
    return {"ssh-keygen ed25519": (tmp / "ed25519").read_text(), "openssl rsa pkcs1": rsa}


JOURNAL = "Nov 30 13:12:{:02d} gpu-node-01 python3[4242]: "


async def _stream(lines: list[str]) -> str:
    """What the terminal shows for a step that printed ``lines``, one event per line."""
    out = io.StringIO()
    sink = TerminalSink(out, redact=Redactor())
    for line in lines:
        await sink.handle(ev.OutputLine(1, "gpu-node-1", Step.REINSTALL, "stderr", line))
    await sink.handle(
        ev.StepFinished(1, "gpu-node-1", Step.REINSTALL, StepStatus.OK, 0, 1.0, "reinstalled", "")
    )
    return out.getvalue()


async def test_a_key_streamed_without_its_begin_line_is_masked_at_every_cut(tmp_path: Path) -> None:
    # A tailed output starts anywhere in a key: the full-width lines are masked one by
    # one, and the short last line before END used to be printed in clear.
    for name, key in _real_keys(tmp_path).items():
        lines = key.strip().splitlines()
        body = lines[1:-1]
        for start in range(1, len(lines) - 1):
            tail = lines[start:]
            cases = {
                "raw": tail,
                "journal": [JOURNAL.format(i) + line for i, line in enumerate(tail)],
            }
            if start < len(lines) - 3:
                # Cut mid-line (a byte-bounded tail), when a full-width line follows it:
                # before the last two lines, telling a piece from a word would take two
                # lines held back.
                cases["mid line"] = [tail[0][len(tail[0]) // 2 :], *tail[1:]]
            if start < len(lines) - 2:
                # Cut before END too (the step ended there): the last line follows key lines.
                cases["no end"] = tail[:-1]
            for case, cut in cases.items():
                text = await _stream(["Resolved 152 packages", *cut, "Installed 1 package"])
                leaks = [
                    run
                    for run in re.findall(r"[A-Za-z0-9+/=]{8,}", text)
                    if any(run in line for line in body)
                ]
                assert not leaks, (name, start, case, text)
                assert "Resolved 152 packages" in text and "Installed 1 package" in text
                assert (lines[-1] in text) == (case != "no end"), (name, start, case, text)
                text = await _stream(cut)  # nothing follows: the step ends there
                assert not [
                    run
                    for run in re.findall(r"[A-Za-z0-9+/=]{8,}", text)
                    if any(run in line for line in body)
                ], (name, start, case, text)


async def test_ordinary_output_is_held_back_one_line_at_most() -> None:
    # A line that could end a key waits for the next one; nothing waits longer, and the
    # end of the step lets the last one out.
    out = io.StringIO()
    sink = TerminalSink(out, redact=Redactor())
    lines = [
        "Resolved 152 packages in 1.2s",
        "Prepared 3 packages in 2m10s",
        "Built vllm-0.6.3 sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c1",
        "Uninstalled 3 packages in 120ms",
        "Installed 3 packages",
    ]
    for i, line in enumerate(lines):
        await sink.handle(ev.OutputLine(1, "gpu-node-1", Step.REINSTALL, "stdout", line))
        assert all(earlier in out.getvalue() for earlier in lines[:i]), (i, out.getvalue())
    await sink.handle(
        ev.StepFinished(1, "gpu-node-1", Step.REINSTALL, StepStatus.OK, 0, 1.0, "reinstalled", "")
    )
    text = out.getvalue()
    assert [text.index(line) for line in lines] == sorted(text.index(line) for line in lines)
    assert "***" not in text


# A line that could end a key (a long random-looking last word): held back one line.
HELD = "Built vllm-0.6.3 sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c1"


async def test_a_held_line_comes_out_before_the_next_event_that_is_no_output() -> None:
    # Progress lines and notices print at once: the line held back must come out before
    # them, not after (a reordering), whatever its stream does next.
    for after, shown in (
        (
            ev.StepProgress(1, "gpu-node-1", Step.REINSTALL, "installing 3 packages"),
            "~ installing 3 packages",
        ),
        (ev.Notice(1, "the audit log cannot be written"), "! the audit log cannot"),
    ):
        out = io.StringIO()
        sink = TerminalSink(out, redact=Redactor())
        await sink.handle(ev.OutputLine(1, "gpu-node-1", Step.REINSTALL, "stdout", HELD))
        assert HELD not in out.getvalue()  # held back: else this shows nothing
        await sink.handle(after)
        await sink.handle(ev.OutputLine(1, "gpu-node-1", Step.REINSTALL, "stdout", "done"))
        text = out.getvalue()
        assert HELD in text and text.index(HELD) < text.index(shown) < text.index("done"), text


async def test_a_run_that_raises_still_shows_its_held_line_masked_if_a_key_tail(
    sim_host: SimKit, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine re-raises a bug of a host's flow: no RunFinished comes to settle the
    # line held back, so the command's own ``finally`` must (a key's last line masked).
    full_key_line = (KEY_BODY * 2)[:70]
    key_tail = "AAAAC3NzaC1lZDI1NTE5"
    cases = {"ordinary": ([HELD], HELD), "key tail": ([full_key_line, key_tail], MASK)}
    for case, (lines, last_shown) in cases.items():
        # A database each: the fake run below keeps its locks, as no real one would.
        (tmp_path / case).mkdir()
        async with open_runtime(sim_settings(sim_host, tmp_path / case)) as rt:

            async def broken(
                run_id: int, sink: ev.EventSink, gate: LeftoverGate | None = None
            ) -> RunResult:
                for line in lines:  # noqa: B023 (called within this iteration)
                    await sink.handle(
                        ev.OutputLine(run_id, sim_host.hostname, Step.REINSTALL, "stdout", line)
                    )
                raise RuntimeError("a bug in a flow")

            monkeypatch.setattr(rt.engine, "execute", broken)
            out = io.StringIO()
            with pytest.raises(RuntimeError, match="a bug in a flow"):
                await run_change(
                    rt,
                    rt.engine.plan(Action.RESTART, SERVICE),
                    yes=True,
                    user="cli:op@host",
                    out=out,
                )
            text = out.getvalue()
            assert text.endswith(f"   | {last_shown}\n"), (case, text)
            assert key_tail not in text and full_key_line not in text, (case, text)


# ---- issue 17 F7: a host's text never drives the operator's terminal ----------------------

# A /v1/models id as a hostile (or broken) model server may send it: erase the line and go
# back to its start (the status line was rewritten), ring the bell, reverse what follows,
# and a one-byte CSI (U+009B) that some terminals obey as ESC [.
HOSTILE_MODEL = "kimi-k2.5\x1b[2K\rall GPUs healthy\a\u202egnp.exe\u009b31m"
RAW_CONTROLS = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def test_visible_writes_controls_out_and_leaves_text_alone() -> None:
    assert visible(HOSTILE_MODEL) == (
        "kimi-k2.5\\x1b[2K\\rall GPUs healthy\\x07\\u202egnp.exe\\u009b31m"
    )
    # Good but unusual: tabs, newlines and any printable script stay as they are.
    text = "GPU\t0\tNVIDIA H200\nmodel: Qwen/Qwen3-235B ✓ 模型 مدل ü\n"
    assert visible(text) == text
    # --json output stays valid JSON that means the same.
    shown = visible(json.dumps({"model": HOSTILE_MODEL}, ensure_ascii=False))
    assert RAW_CONTROLS.search(shown) is None
    assert json.loads(shown) == {"model": HOSTILE_MODEL}


async def test_host_text_with_terminal_controls_reaches_no_cli_writer_raw(
    sim_host: SimKit, tmp_path: Path
) -> None:
    # python -m bot in a subprocess, as an operator runs it: the status read, a restart's
    # progress, the audit log (a run's steps, the JSON list) and the runs list, each a
    # real writer.
    sim_host.update_config(served_model=HOSTILE_MODEL)
    # The restart's readiness expects the model configured, so it fails naming the one
    # the server lists: host text in a run's steps.
    fragment = sim_host.settings_fragment(served_model="kimi-k2.5")
    config = write_toml(tmp_path / "chatops.toml", fragment)
    env = {"CHATOPS_CONFIG": str(config), "CHATOPS_DB": str(tmp_path / "audit.db")}
    outputs = {}
    code, outputs["status"], err = await cli("status", SERVICE, cwd=tmp_path, env=env)
    assert code == 0, err
    code, outputs["restart"], err = await cli("restart", SERVICE, "--yes", cwd=tmp_path, env=env)
    assert code == 1 and RAW_CONTROLS.search(err) is None, err
    for args in (("audit", "--run", "1"), ("audit", "--json"), ("runs", "--json"), ("runs",)):
        code, outputs[" ".join(args)], err = await cli(*args, cwd=tmp_path, env=env)
        assert code == 0, err
        assert RAW_CONTROLS.search(err) is None
    for name, out in outputs.items():
        assert RAW_CONTROLS.search(out) is None, (name, out)
    # Shown, not dropped: the evidence is there to read.
    written = "kimi-k2.5\\x1b[2K\\rall GPUs healthy\\x07\\u202egnp.exe\\u009b31m"
    assert written in outputs["status"], outputs["status"]
    assert written in outputs["audit --run 1"], outputs["audit --run 1"]
    assert json.loads(outputs["audit --json"])[0]["id"] == 1


@pytest.mark.parametrize(
    ("before", "after", "shown"),
    [
        ("0.15.0", "0.16.0", "(version 0.15.0 -> 0.16.0)"),
        # A run that ended before its install (aborted, a refusal) read no version after.
        ("0.15.0", None, "(version 0.15.0 -> ?)"),
        (None, "0.16.0", "(version ? -> 0.16.0)"),
    ],
)
async def test_the_closing_line_never_shows_none_for_a_version_not_read(
    before: str | None, after: str | None, shown: str
) -> None:
    out = io.StringIO()
    sink = TerminalSink(out, redact=Redactor())
    await sink.handle(
        ev.RunFinished(7, RunStatus.ABORTED, "refused", before, after, ServiceState.UP)
    )
    assert shown in out.getvalue() and "None" not in out.getvalue(), out.getvalue()
