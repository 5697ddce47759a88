"""Issue 9, end to end: a bot (or a CLI) killed with SIGKILL mid-install, whose process is
left a zombie because its parent does not reap it, must not lock the service for good.

The bot runs as a separate process (``python -m bot``, HTTP mode, the fake Slack of
tests/fakes at its API boundary), the GPU host is the simulated one behind a real
OpenSSH sshd, and the audit database is a real file shared by the processes.

How the late reaping is reproduced: the bot is the child of an intermediate parent
(``_PARENT``) that does not wait() for it until the test lets it, and it leads its own
process group, which is what the test kills. After the kill, /proc/<pid>/stat still
shows the bot with its start time, in state Z: the entry that fooled the old liveness
check into calling a dead owner alive.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.engine.owner import read_stat
from bot.sim.kit import SERVICE, SimKit
from tests.fakes import FakeSlack, SlackSigner
from tests.polling import eventually
from tests.support.cli import REPO_ROOT, toml_value, write_toml

ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"
APPROVERS_GROUP = "S0APPROVERS"
CHANNEL = "C0OPS"
SIGNING_SECRET = "test-signing-secret-0123456789"
# The bar: within this long of the restart the run is recovered, its thread told
# and a new request gets its card. Measured from the restarted process's first act (the
# bot's auth.test, the CLI's request), not from its spawn: importing the bot alone takes
# 6-7 s of wall time on a loaded 2-core CI machine (2.9 s of CPU), which says nothing
# about recovery. Both times are printed.
RECOVERED_WITHIN_S = 5.0
# Long enough for a restart on a loaded machine.
START_S = 60.0

# Forks the command (argv[2:]) as the leader of a new process group and session, with its
# output in argv[1]; prints its pid; then does not wait() for it until stdin closes, so
# a killed command stays a zombie meanwhile.
_PARENT = r"""
import os, sys
log, argv = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.execvp(argv[0], argv)
print(pid, flush=True)
sys.stdin.read()
os.waitpid(pid, 0)
"""


@dataclass
class Unreaped:
    """A command whose parent will not reap it until ``release``."""

    parent: asyncio.subprocess.Process
    pid: int
    log: Path

    def kill_group(self) -> None:
        os.killpg(self.pid, signal.SIGKILL)  # the whole process group, as the issue did

    def state(self) -> str | None:
        stat = read_stat(self.pid)
        return None if stat is None else stat.state

    async def release(self) -> None:
        if self.state() not in (None, "Z"):
            self.kill_group()
        assert self.parent.stdin is not None
        self.parent.stdin.close()
        await self.parent.wait()


@asynccontextmanager
async def unreaped(
    argv: list[str], *, env: dict[str, str], cwd: Path, log: Path
) -> AsyncIterator[Unreaped]:
    parent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _PARENT,
        str(log),
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert parent.stdout is not None
    proc = Unreaped(parent, int(await parent.stdout.readline()), log)
    try:
        yield proc
    finally:
        await proc.release()


async def killed_into_a_zombie(proc: Unreaped) -> None:
    start = read_stat(proc.pid)
    assert start is not None
    proc.kill_group()
    await eventually(lambda: proc.state() == "Z", "the killed process to be a zombie", 10)
    # What the old check read: the PID is there, with the same start time.
    after = read_stat(proc.pid)
    assert after is not None and after.start_time == start.start_time


def db_row(db: Path, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
    if not db.exists():
        return None
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            return conn.execute(sql, params).fetchone()  # type: ignore[no-any-return]
    except sqlite3.OperationalError:  # not created yet, or mid-migration
        return None


def in_reinstall(db: Path, run_id: int) -> bool:
    row = db_row(db, "SELECT status FROM steps WHERE run_id = ? AND step = 'reinstall'", (run_id,))
    return row == ("running",)


def run_status(db: Path, run_id: int) -> str | None:
    row = db_row(db, "SELECT status FROM runs WHERE id = ?", (run_id,))
    return None if row is None else str(row[0])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bot_env(
    tmp_path: Path, kit: SimKit, fake: FakeSlack | None = None, port: int | None = None
) -> dict[str, str]:
    config = write_toml(tmp_path / "chatops.toml", kit.settings_fragment())
    with config.open("a") as f:
        f.write(
            f"[policy]\nrequesters = {toml_value([ALICE, CAROL])}\n"
            f"approvers = {toml_value([APPROVERS_GROUP])}\n"
            "min_approvals = 1\napproval_ttl_s = 600\n"
            f"[slack]\nchannels = {toml_value([CHANNEL])}\n"
            "post_interval_s = 0.06\nupdate_interval_s = 0.2\n"
        )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "CHATOPS_CONFIG": str(config),
        "CHATOPS_DB": str(tmp_path / "audit.db"),
    }
    if fake is not None:
        env.update(
            {
                "SLACK_BOT_TOKEN": fake.bot_token,
                "SLACK_SIGNING_SECRET": SIGNING_SECRET,
                "SLACK_API_URL": fake.base_url,
                "PORT": str(port),
            }
        )
        env.pop("SLACK_APP_TOKEN", None)
    return env


# ---- the Slack bot ---------------------------------------------------------------------------


@dataclass
class BotClient:
    fake: FakeSlack
    url: str
    db: Path
    signer: SlackSigner

    async def command(self, text: str, user: str) -> None:
        payload = self.fake.slash_command(text, user_id=user, channel_id=CHANNEL)
        result = await self.signer.slash_command(payload).post(self.url)
        assert result.status == 200, result

    async def click(self, action_id: str, run_id: int, ts: str, user: str) -> None:
        payload = self.fake.block_action(
            action_id, str(run_id), channel_id=CHANNEL, message_ts=ts, user_id=user
        )
        result = await self.signer.interactive(payload).post(self.url)
        assert result.status == 200, result

    def card_of(self, run_id: int) -> str | None:
        row = db_row(self.db, "SELECT message_ts FROM runs WHERE id = ?", (run_id,))
        return None if row is None or row[0] is None else str(row[0])

    def thread_text(self, ts: str) -> str:
        return "\n".join(str(m.get("text", "")) for m in self.fake.thread(CHANNEL, ts)[1:])


async def serving(log: Path, proc_alive: Any) -> None:
    def ready() -> bool:
        assert proc_alive(), f"the bot exited:\n{log.read_text() if log.exists() else ''}"
        return log.exists() and "serving Slack events" in log.read_text()

    await eventually(ready, "the bot to serve HTTP", 60)


async def test_a_bot_killed_mid_install_and_left_a_zombie_is_recovered_at_restart(
    tmp_path: Path, sim_sshd_host: SimKit
) -> None:
    kit = sim_sshd_host
    kit.set_faults(uv_stalls=True)  # the reinstall goes on until the kill
    async with FakeSlack(
        channels=[CHANNEL], usergroups={APPROVERS_GROUP: [BOB]}, post_rate_per_s=20
    ) as fake:
        port = free_port()
        env = bot_env(tmp_path, kit, fake, port)
        db = tmp_path / "audit.db"
        bot = BotClient(
            fake, f"http://127.0.0.1:{port}/slack/events", db, SlackSigner(SIGNING_SECRET)
        )
        argv = [sys.executable, "-m", "bot"]
        async with unreaped(argv, env=env, cwd=tmp_path, log=tmp_path / "bot-1.log") as first:
            await serving(first.log, lambda: first.state() not in (None, "Z"))
            await bot.command(f"redeploy {SERVICE} --version 0.31.0", ALICE)
            card = await eventually(lambda: bot.card_of(1), "the first card", 15)
            await bot.click("approve", 1, card, BOB)
            await eventually(lambda: in_reinstall(db, 1), "the bot to reach the reinstall", 30)
            await killed_into_a_zombie(first)
            assert run_status(db, 1) == "running"  # what the killed bot left behind

            # The same bot, restarted on the same database while the old one is a zombie.
            log = (tmp_path / "bot-2.log").open("w")
            checks = len(fake.calls("auth.test"))  # the first bot's (bolt checks too)
            restarted = time.monotonic()
            second = await asyncio.create_subprocess_exec(
                *argv,
                cwd=tmp_path,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
            )
            try:
                # Its first act once imported and configured: the token check.
                up = (await fake.wait_for_call("auth.test", count=checks + 1, timeout=START_S)).at
                await eventually(
                    lambda: run_status(db, 1) == "interrupted", "the run to be recovered", START_S
                )
                recovered = time.monotonic()
                told = await eventually(
                    lambda: "was interrupted" in bot.thread_text(card) and bot.thread_text(card),
                    "the thread to be told",
                    START_S,
                )
                assert "during step `reinstall`" in told and "STOPPED" in told
                told_at = time.monotonic()
                await serving(tmp_path / "bot-2.log", lambda: second.returncode is None)
                await bot.command(f"redeploy {SERVICE} --version 0.31.0", CAROL)
                await eventually(
                    lambda: bot.card_of(2), "a card for the new request", RECOVERED_WITHIN_S
                )
                carded = time.monotonic()
                assert run_status(db, 2) == "pending_approval"
                assert "Approve" in str(fake.message(CHANNEL, bot.card_of(2) or ""))
                print(
                    f"\nafter the restart (spawn / first act): up {up - restarted:.2f} s; "
                    f"recovered {recovered - restarted:.2f} / {recovered - up:.2f} s; "
                    f"thread told {told_at - restarted:.2f} / {told_at - up:.2f} s; "
                    f"new card {carded - restarted:.2f} / {carded - up:.2f} s"
                )
                assert carded - up < RECOVERED_WITHIN_S, carded - up
                assert first.state() == "Z"  # still a zombie all along
                assert db_row(
                    db, "SELECT user FROM decisions WHERE run_id = 1 AND decision = 'recover'"
                ) == ("system:recovery",)
            finally:
                second.send_signal(signal.SIGTERM)
                await second.wait()
                log.close()
    kit.clear_faults()  # let the host's uv, orphaned by the kill, end


# ---- the command line ------------------------------------------------------------------------


async def test_a_cli_killed_mid_install_and_left_a_zombie_is_recovered_by_the_next_cli(
    tmp_path: Path, sim_sshd_host: SimKit
) -> None:
    kit = sim_sshd_host
    kit.set_faults(uv_stalls=True)
    env = bot_env(tmp_path, kit)
    db = tmp_path / "audit.db"
    redeploy = [sys.executable, "-m", "bot", "redeploy", SERVICE, "--version", "0.31.0", "--yes"]
    async with unreaped(redeploy, env=env, cwd=tmp_path, log=tmp_path / "cli-1.log") as first:
        await eventually(lambda: in_reinstall(db, 1), "the CLI to reach the reinstall", 60)
        await killed_into_a_zombie(first)
        kit.clear_faults()  # the orphaned uv on the host may now end

        started = time.monotonic()
        second = await asyncio.create_subprocess_exec(
            *redeploy,
            cwd=tmp_path,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        # Its first act once imported and configured: recording its request (run #2).
        await eventually(lambda: run_status(db, 2) is not None, "the second request", START_S)
        up = time.monotonic()
        await eventually(
            lambda: run_status(db, 1) == "interrupted",
            "the second CLI to recover the first's run",
            RECOVERED_WITHIN_S,
        )
        recovered = time.monotonic()
        out, err = await second.communicate()
        text = out.decode()
        assert second.returncode == 0, text + err.decode()
        assert first.state() == "Z"
    print(
        f"\nthe second CLI recovered run #1 {recovered - started:.2f} s after its spawn, "
        f"{recovered - up:.2f} s after its request"
    )
    assert "recovered: Run #1 (redeploy kimi-k25) was interrupted: the command line" in text
    assert "during step `reinstall`" in text and "SUCCEEDED" in text
    assert run_status(db, 1) == "interrupted" and run_status(db, 2) == "succeeded"
    assert kit.installed_version == "0.31.0"
