"""Output that never ends a line (security review, issue 9): the pump holds a bounded
part of any line and says what it cut, the bot's memory stays bounded end to end over
real OpenSSH, and a file Slack refuses as too large (413) is not retried."""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import sqlite3
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from slack_sdk.errors import SlackRequestError

from bot.core import events as ev
from bot.core.plan import Step
from bot.core.status import StepStatus
from bot.hosts.base import LINE_OVERHEAD, MAX_LINE_CHARS, cut_line, cut_marker
from bot.hosts.local import LocalTransport
from bot.hosts.streams import MAX_CAPTURE_CHARS, Capture, LineSplitter, pump
from bot.sim.kit import SimKit
from bot.slack.poster import is_transient
from bot.slack.reporter import MAX_LOG_CHARS
from tests.fakes import FakeSlack, SlackSigner
from tests.polling import eventually
from tests.slack_harness import blocks_text
from tests.support.cli import REPO_ROOT, write_toml
from tests.test_reliability_zombie import (  # the bot-as-a-process harness
    ALICE,
    BOB,
    SIGNING_SECRET,
    BotClient,
    bot_env,
    free_port,
    run_status,
)
from tests.test_reliability_zombie import CHANNEL as BOT_CHANNEL
from tests.test_slack_reporter import CHANNEL, reporter_for

MIB = 1024 * 1024
CUT = re.compile(r"… \[line cut: ([0-9,]+) more characters\]$")


def cut_count(line: str) -> int:
    match = CUT.search(line)
    assert match is not None, line[-120:]
    return int(match[1].replace(",", ""))


class EndlessReader:
    """An SSHReader-shaped source of ``total`` characters and no newline (``tail`` at the
    end), which never suspends: a reader whose buffer always holds data."""

    def __init__(self, total: int, *, tail: str = "", chunk: int = 64 * 1024) -> None:
        self.left = total
        self.tail = tail
        self.block = "C" * chunk
        self.reads = 0

    async def read(self, n: int = -1) -> str:
        self.reads += 1
        if self.left > 0:
            size = min(self.left, len(self.block), n)
            self.left -= size
            return self.block if size == len(self.block) else self.block[:size]
        text, self.tail = self.tail, ""
        return text


# ---- the splitter and the pump -----------------------------------------------------------


def test_lines_are_split_across_chunks_and_only_over_long_ones_are_cut() -> None:
    splitter = LineSplitter(limit=100)
    assert splitter.feed("ab") == []
    assert splitter.feed("c\nde\n\nf") == ["abc\n", "de\n", "\n"]
    assert splitter.feed("x" * 99 + "\n") == ["f" + "x" * 99 + "\n"]  # at the limit: whole
    assert splitter.feed("y" * 250) == []
    # 300 characters: the first 36 kept, room left for the marker within the 100.
    assert splitter.feed("y" * 50 + "\nnext\n") == ["y" * 36 + cut_marker(264) + "\n", "next\n"]
    assert splitter.feed("tail") == [] and splitter.close() == "tail"
    assert splitter.close() is None


def _lines_one_at_a_time(chunks: list[str], limit: int) -> list[str]:
    """The splitter's meaning, the plain way: each whole line cut to ``limit``, with its
    newline; what follows the last newline comes out at the close, without one."""
    text = "".join(chunks)
    *whole, rest = text.split("\n")
    return [cut_line(line, limit=limit) + "\n" for line in whole] + (
        [cut_line(rest, limit=limit)] if rest else []
    )


@given(
    st.lists(st.integers(min_value=0, max_value=200), max_size=8),
    st.lists(st.integers(min_value=0, max_value=1800), max_size=6),
    st.integers(min_value=70, max_value=120),
)
def test_the_splitter_gives_each_line_once_whatever_the_chunks(
    lengths: list[int], cuts: list[int], limit: int
) -> None:
    # The splitter takes the lines whole in a chunk in one split, and carries a line
    # across chunks by its kept part: both must give what splitting the whole text does,
    # lines over the limit included.
    text = "\n".join(f"{i}:" + "x" * n for i, n in enumerate(lengths))
    at = [0, *sorted(c for c in cuts if c < len(text)), len(text)]
    chunks = [text[a:b] for a, b in itertools.pairwise(at)]
    splitter = LineSplitter(limit=limit)
    out = [line for chunk in chunks for line in splitter.feed(chunk)]
    last = splitter.close()
    assert out + ([last] if last is not None else []) == _lines_one_at_a_time(chunks, limit)


def test_a_cut_line_says_exactly_how_much_is_missing() -> None:
    line = cut_line("z" * 10_000, limit=1000)
    kept = line.index("…")
    assert len(line) <= 1000 and cut_count(line) == 10_000 - kept
    assert cut_line(line, limit=1000) == line  # cutting again changes nothing
    assert cut_line("short") == "short"


async def test_the_pump_holds_a_bounded_part_of_an_endless_line() -> None:
    total = 64 * MIB
    reader = EndlessReader(total, tail="\nafter\n")
    capture = Capture()
    seen: list[str] = []
    tracemalloc.start()
    try:
        await pump(reader, "stderr", capture, lambda _s, line: seen.append(line))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(seen) == 2 and seen[1] == "after"
    line = seen[0]
    assert len(line) <= MAX_LINE_CHARS and line.startswith("CCCC")
    assert cut_count(line) == total - line.index("…")
    assert capture.text() == f"{line}\nafter\n"
    # 64 MiB went through; the pump held a few copies of one line's bound at most (the
    # kept part, a slice, the finished line), about 1/1000 of it.
    assert peak < 8 * MAX_LINE_CHARS, peak


async def test_the_pump_lets_other_tasks_run_while_a_host_floods() -> None:
    ticks = 0
    ticks_at_read: list[int] = []

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    class Watched(EndlessReader):
        async def read(self, n: int = -1) -> str:
            ticks_at_read.append(ticks)
            return await super().read(n)

    task = asyncio.create_task(ticker())
    try:
        await pump(Watched(8 * MIB, chunk=256 * 1024), "stdout", Capture(), None)
    finally:
        task.cancel()
    # The reader never suspends, yet the ticker ran between any two reads, once per slice.
    gaps = [b - a for a, b in itertools.pairwise(ticks_at_read)]
    assert len(gaps) >= 32 and min(gaps) >= 10, gaps


async def test_a_pipe_pump_decodes_characters_split_between_reads() -> None:
    reader = asyncio.StreamReader()
    for part in (b"caf\xc3", b"\xa9 ok\n", "€".encode()[:1], "€".encode()[1:], b"\n"):
        reader.feed_data(part)
    reader.feed_eof()
    seen: list[str] = []
    await pump(reader, "stdout", Capture(), lambda _s, line: seen.append(line))
    assert seen == ["café ok", "€"]


async def test_the_local_transport_cuts_an_endless_line(tmp_path: Path) -> None:
    flood = 40 * 1000 * 1000
    r = await LocalTransport("local").run(
        ["sh", "-c", f"head -c {flood} /dev/zero | tr '\\0' C; echo; echo after"], timeout_s=60
    )
    assert r.exit_status == 0
    line, after = r.stdout.splitlines()
    assert after == "after" and len(line) <= MAX_LINE_CHARS
    assert cut_count(line) == flood - line.index("…")


# ---- end to end: the bot's memory while a host prints a 256 MiB line over OpenSSH -------

# A child process is the bot: the engine's executor drives the real install argv over the
# real transport to the simulated host, every line goes to the terminal sink.
CHILD = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from bot.cli.terminal import TerminalSink
    from bot.core import remote
    from bot.core.flows import BeginStep, Emit, EndStep, HostOutcome, RunCommand
    from bot.core.plan import Step
    from bot.core.service_state import ServiceState
    from bot.engine.executor import Executor
    from bot.hosts.pool import HostPool
    from bot.settings import load_settings

    async def main() -> None:
        settings = load_settings(Path(sys.argv[1]))
        svc = next(iter(settings.services.values()))
        argv = remote.install(svc, "vllm==0.31.0", None)

        def flow():
            yield Emit(BeginStep(Step.REINSTALL, " ".join(argv)))
            r = yield RunCommand(Step.REINSTALL, argv, 60.0)
            yield Emit(EndStep(Step.REINSTALL, r.ok, "reinstall", r.exit_status))
            return HostOutcome("succeeded" if r.ok else "failed", "done", ServiceState.UNKNOWN)

        pool = HostPool(settings)
        try:
            outcome = await Executor(1, pool.get(svc.hosts[0]), TerminalSink()).drive(flow())
        finally:
            await pool.close()
        print("OUTCOME", outcome.status)

    asyncio.run(main())
""")


def _spawn(argv: list[str], env: dict[str, str], cwd: Path, out: Path) -> int:
    """Start argv with stdout+stderr to ``out``; reap it with ``os.wait4`` (its peak RSS)."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(out), os.O_WRONLY | os.O_CREAT, 0o600),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    before = Path.cwd()
    os.chdir(cwd)  # posix_spawn has no cwd; the child imports bot from PYTHONPATH only
    try:
        return os.posix_spawn(argv[0], argv, env, file_actions=actions)
    finally:
        os.chdir(before)


def _run_measured(argv: list[str], env: dict[str, str], cwd: Path, out: Path) -> tuple[int, int]:
    """Run argv with stdout+stderr to ``out``: its exit code and peak RSS in KiB, from the
    kernel's own account of that one child (wait4), not a sample."""
    _, status, usage = os.wait4(_spawn(argv, env, cwd, out), 0)
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss


@pytest.mark.alone
async def test_a_256_mib_line_over_sshd_keeps_the_bot_under_200_mib(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    flood = 256 * MIB
    sim_sshd_host.update_config(flood_chars=flood)
    sim_sshd_host.set_faults(uv_floods=True)
    config = write_toml(tmp_path / "chatops.toml", sim_sshd_host.settings_fragment())
    out = tmp_path / "bot.out"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    started = time.monotonic()
    code, peak_kib = await asyncio.to_thread(
        _run_measured, [sys.executable, "-c", CHILD, str(config)], env, tmp_path, out
    )
    text = out.read_text()
    assert code == 0, text[-3000:]
    assert "OUTCOME succeeded" in text and sim_sshd_host.installed_version == "0.31.0"
    [flooded] = [line for line in text.splitlines() if "line cut:" in line]
    assert flooded.startswith("[gpu-node-1]   | CCCC") and len(flooded) < MAX_LINE_CHARS + 100
    assert cut_count(flooded) == flood - flooded[flooded.index("C") :].index("…")
    # Before the fix the same line took this process past 370 MiB (100 MiB line) and 2 GB.
    assert peak_kib < 200 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
    print(f"\n256 MiB line: {time.monotonic() - started:.1f} s, peak RSS {peak_kib / 1024:.0f} MiB")


# ---- Slack: a file too large for it ---------------------------------------------------------


async def test_a_file_slack_refuses_as_too_large_is_not_retried(fake: FakeSlack) -> None:
    fake.max_upload_bytes = 10_000
    reporter = await reporter_for(fake)
    lines = [f"build line {i} " + "x" * 80 for i in range(2000)]
    await reporter.handle(ev.StepStarted(1, "gpu-1", Step.REINSTALL, "cmd"))
    for line in lines:
        await reporter.handle(ev.OutputLine(1, "gpu-1", Step.REINSTALL, "stderr", line))
    await reporter.handle(
        ev.StepFinished(
            1,
            "gpu-1",
            Step.REINSTALL,
            StepStatus.FAILED,
            1,
            2.0,
            "reinstall failed",
            "\n".join(lines[-200:]),
        )
    )
    reporter.start()
    assert await reporter.flush(30)
    assert len(fake.calls("files.getUploadURLExternal")) == 1  # refused once, not retried
    assert fake.calls("files.completeUploadExternal") == []
    step, note = (blocks_text(m) for m in fake.thread(CHANNEL, reporter.ts)[1:])
    assert "build line 1999" in step  # the tail went out in the reply itself
    assert "could not be attached" in note and "too large" in note
    assert f"{len(chr(10).join(lines)):,} characters" in note
    assert reporter.failures == 1


def test_upload_statuses_from_slack_sdk_are_sorted_by_what_a_retry_can_fix() -> None:
    # The message slack_sdk (3.x, web/async_client.py files_upload_v2) raises for a failed
    # POST to the upload URL; the status is only in the text.
    def upload_error(status: int) -> SlackRequestError:
        return SlackRequestError(
            f"Failed to upload a file (status: {status}, body: x, filename: run1.log, title: log)"
        )

    assert not is_transient(upload_error(413))
    assert not is_transient(upload_error(400))
    assert is_transient(upload_error(503)) and is_transient(upload_error(429))
    assert not is_transient(SlackRequestError("Either file or url must be provided."))


async def test_a_flood_of_short_lines_keeps_the_threads_log_within_its_budget(
    fake: FakeSlack,
) -> None:
    # `seq 1 1000000000`: each line is a few characters but a whole Python object.
    reporter = await reporter_for(fake)
    await reporter.handle(ev.StepStarted(1, "gpu-1", Step.REINSTALL, "cmd"))
    printed = [str(i) for i in range(1_000_000, 1_300_000)]
    for line in printed:
        reporter.apply(ev.OutputLine(1, "gpu-1", Step.REINSTALL, "stdout", line))
    await reporter.handle(
        ev.StepFinished(
            1, "gpu-1", Step.REINSTALL, StepStatus.OK, 0, 1.0, "done", "\n".join(printed[-200:])
        )
    )
    reporter.start()
    assert await reporter.flush(30)
    [log] = fake.files
    head, *kept = log.text.rstrip().splitlines()
    assert "earlier lines not kept" in head and kept[-1] == "1299999"
    # What those lines held in memory (a str each, and its slot in the deque) stayed
    # within the budget; all 300,000 kept would have been about 19 MB.
    held = sum(sys.getsizeof(line) + 8 for line in kept)
    assert held <= MAX_LOG_CHARS, f"{held / MIB:.1f} MiB in {len(kept):,} lines"
    assert len(kept) == MAX_LOG_CHARS // (7 + LINE_OVERHEAD)


def test_a_capture_counts_what_each_line_costs() -> None:
    capture = Capture()
    for i in range(1_000_000, 1_300_000):
        capture.add(f"{i}\n")
    kept = capture.text().splitlines()
    assert kept[-1] == "1299999"
    assert len(kept) <= MAX_CAPTURE_CHARS // (8 + LINE_OVERHEAD) + 1


# ---- end to end: the whole Slack bot's memory while a host prints a 256 MiB line --------


@pytest.mark.alone
async def test_the_slack_bot_redeploying_through_a_256_mib_line_stays_under_200_mib(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    # The bot as it runs in production (`python -m bot`, HTTP mode): engine, Slack reporter
    # (thread, card, the step's output as a file) and the audit sink, all in one process.
    flood = 256 * MIB
    sim_sshd_host.update_config(flood_chars=flood)
    sim_sshd_host.set_faults(uv_floods=True)
    async with FakeSlack(
        channels=[BOT_CHANNEL], usergroups={"S0APPROVERS": [BOB]}, post_rate_per_s=20
    ) as fake:
        port = free_port()
        env = bot_env(tmp_path, sim_sshd_host, fake, port)
        db = tmp_path / "audit.db"
        log = tmp_path / "bot.log"
        pid = _spawn([sys.executable, "-m", "bot"], env, tmp_path, log)
        reaped = False
        try:
            await eventually(
                lambda: "serving Slack events" in log.read_text(), "the bot to serve HTTP", 60
            )
            bot = BotClient(
                fake, f"http://127.0.0.1:{port}/slack/events", db, SlackSigner(SIGNING_SECRET)
            )
            await bot.command("redeploy kimi-k25 --version 0.31.0", ALICE)
            card = await eventually(lambda: bot.card_of(1), "the card", 30)
            await bot.click("approve", 1, card, BOB)
            await eventually(
                lambda: run_status(db, 1) in ("succeeded", "failed", "rolled_back"),
                "the run to end",
                240,
            )
            assert run_status(db, 1) == "succeeded", log.read_text()[-3000:]
            await eventually(
                lambda: "succeeded" in str(fake.message(BOT_CHANNEL, card)),
                "the card to say so",
                30,
            )
            os.kill(pid, signal.SIGTERM)
            _, status, usage = await asyncio.to_thread(os.wait4, pid, 0)
            reaped = True
        finally:
            if not reaped:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    peak_kib = usage.ru_maxrss
    print(f"\nthe Slack bot through a 256 MiB line: peak RSS {peak_kib / 1024:.0f} MiB")
    assert os.waitstatus_to_exitcode(status) == 0, log.read_text()[-3000:]
    assert sim_sshd_host.installed_version == "0.31.0"
    # The flood reached the bot and was cut, saying so.
    row = (
        sqlite3.connect(db)
        .execute("SELECT output_tail FROM steps WHERE run_id = 1 AND step = 'reinstall'")
        .fetchone()
    )
    assert row is not None and "line cut:" in row[0]
    assert peak_kib < 200 * 1024, f"peak RSS {peak_kib / 1024:.0f} MiB"
