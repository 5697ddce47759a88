"""Several real bot processes on one PostgreSQL database (issue 21): each ``python -m
bot`` in Slack HTTP mode on its own loopback port, all on the same fake Slack
(tests/fakes), the same simulated GPU host behind a real OpenSSH sshd, and a real
PostgreSQL server (tests.support.postgres). A test sends its signed Slack requests to
whichever replica it chooses, as a load balancer would, and kills, stops or resumes a
replica's process, or restarts the database under them.

Each replica is a fork of an interpreter that has imported the bot
(tests.support.cli_zygote), so a start costs its own work, not the imports; its PID is
the one it prints when it serves (``serving Slack events ... (pid N)``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.settings import PostgresUrl
from bot.sim.kit import SimKit
from tests.fakes import FakeSlack, SlackSigner
from tests.polling import eventually
from tests.support.audit_db import db_arg, raw_rows
from tests.support.cli import toml_value, write_toml
from tests.support.cli_zygote import zygote_start, zygote_wait

ALICE, BOB, CAROL = "U0ALICE", "U0BOB", "U0CAROL"
APPROVERS_GROUP = "S0APPROVERS"
CHANNEL = "C0OPS"
SIGNING_SECRET = "test-signing-secret-0123456789"
# Short leases so a replica's death is noticed in seconds, yet longer than the lease
# margin the settings demand (the simulated host's 5 s SSH connect timeout plus 2 s for a
# command's start); renewed at least three times a lease, as the defaults.
TIMINGS = {"lease_s": 8.0, "renew_every_s": 0.5, "leader_ttl_s": 3.0, "sweep_every_s": 0.5}
START_S = 60.0  # a start on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Replica:
    name: str
    url: str
    log: Path
    conn: socket.socket
    ended: asyncio.Task[int]
    pid: int = 0

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, sig: signal.Signals) -> None:
        os.kill(self.pid, sig)


@dataclass
class Cluster:
    fake: FakeSlack
    kit: SimKit
    db: PostgresUrl
    base: Path
    env: dict[str, str]
    replicas: list[Replica] = field(default_factory=list)
    signer: SlackSigner = field(default_factory=lambda: SlackSigner(SIGNING_SECRET))

    async def start(self, name: str) -> Replica:
        port = free_port()
        log = self.base / f"{name}.log"
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with open(os.devnull, "rb") as devnull:
            conn = zygote_start(
                [],
                env={**os.environ, **self.env, "PORT": str(port)},
                cwd=self.base,
                stdin=devnull.fileno(),
                stdout=out,
                stderr=out,
            )
        os.close(out)
        replica = Replica(
            name,
            f"http://127.0.0.1:{port}/slack/events",
            log,
            conn,
            asyncio.ensure_future(zygote_wait(conn)),
        )
        self.replicas.append(replica)

        def serving() -> int:
            assert not replica.ended.done(), f"{name} ended:\n{replica.text()}"
            found = re.search(r"serving Slack events .* \(pid (\d+)\)", replica.text())
            return int(found.group(1)) if found else 0

        replica.pid = await eventually(serving, f"{name} to serve Slack events", START_S)
        return replica

    async def stop_all(self) -> None:
        for replica in self.replicas:
            if not replica.ended.done():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(replica.pid, signal.SIGCONT)
                    os.kill(replica.pid, signal.SIGTERM)
        for replica in self.replicas:
            try:
                await asyncio.wait_for(asyncio.shield(replica.ended), 30)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(replica.pid, signal.SIGKILL)
                await replica.ended

    # ---- what Slack sends ----------------------------------------------------------------

    async def command(self, replica: Replica, text: str, user: str) -> None:
        payload = self.fake.slash_command(text, user_id=user, channel_id=CHANNEL)
        result = await self.signer.slash_command(payload).post(replica.url)
        assert result.status == 200, result

    def click_payload(self, action_id: str, run_id: int, user: str) -> dict[str, Any]:
        ts = self.card_of(run_id)
        assert ts is not None, f"run #{run_id} has no card"
        return self.fake.block_action(
            action_id, str(run_id), channel_id=CHANNEL, message_ts=ts, user_id=user
        )

    async def send_click(self, replica: Replica, payload: dict[str, Any]) -> None:
        result = await self.signer.interactive(payload).post(replica.url)
        assert result.status == 200, result

    async def click(self, replica: Replica, action_id: str, run_id: int, user: str) -> None:
        await self.send_click(replica, self.click_payload(action_id, run_id, user))

    # ---- what the database and the thread say -----------------------------------------------

    def row(self, sql: str, params: tuple[Any, ...] = ()) -> tuple[Any, ...] | None:
        rows = raw_rows(self.db, sql, params)
        return rows[0] if rows else None

    def status(self, run_id: int) -> str | None:
        row = self.row("SELECT status FROM runs WHERE id = ?", (run_id,))
        return None if row is None else str(row[0])

    def card_of(self, run_id: int) -> str | None:
        row = self.row("SELECT message_ts FROM runs WHERE id = ?", (run_id,))
        return None if row is None or row[0] is None else str(row[0])

    def step_running(self, run_id: int, step: str) -> bool:
        row = self.row("SELECT status FROM steps WHERE run_id = ? AND step = ?", (run_id, step))
        return row == ("running",)

    def driver_pid(self, run_id: int) -> int:
        """The PID in the run's owner (``host/boot=.../pidns=...:pid:start``)."""
        row = self.row("SELECT owner FROM runs WHERE id = ?", (run_id,))
        assert row is not None and row[0], f"run #{run_id} has no owner"
        return int(str(row[0]).rsplit(":", 2)[1])

    def thread_text(self, run_id: int) -> str:
        ts = self.card_of(run_id)
        if ts is None:
            return ""
        return "\n".join(str(m.get("text", "")) for m in self.fake.thread(CHANNEL, ts)[1:])


def config(base: Path, kit: SimKit, **replicas: float) -> Path:
    path = write_toml(base / "chatops.toml", kit.settings_fragment())
    with path.open("a") as f:
        f.write(
            f"[policy]\nrequesters = {toml_value([ALICE, CAROL])}\n"
            f"approvers = {toml_value([APPROVERS_GROUP])}\n"
            "min_approvals = 1\napproval_ttl_s = 600\n"
            f"[slack]\nchannels = {toml_value([CHANNEL])}\n"
            "post_interval_s = 0.06\nupdate_interval_s = 0.2\n"
            # A database away is found out within a second or two, as the tests restart it.
            f"[audit]\njournal_dir = {toml_value(str(base))}\nretry_s = 0.5\n"
            "busy_timeout_s = 1.0\n"
            "[replicas]\n"
            + "".join(f"{k} = {toml_value(v)}\n" for k, v in {**TIMINGS, **replicas}.items())
        )
    return path


@asynccontextmanager
async def cluster(
    base: Path, kit: SimKit, db: PostgresUrl, **replicas: float
) -> AsyncIterator[Cluster]:
    """The fake Slack and the environment replicas start with; every replica started in
    it is stopped at its end (resumed first, if a test left it stopped)."""
    async with FakeSlack(
        channels=[CHANNEL], usergroups={APPROVERS_GROUP: [BOB, CAROL]}, post_rate_per_s=20
    ) as fake:
        env = {
            "CHATOPS_CONFIG": str(config(base, kit, **replicas)),
            "CHATOPS_DB": db_arg(db),
            "SLACK_BOT_TOKEN": fake.bot_token,
            "SLACK_SIGNING_SECRET": SIGNING_SECRET,
            "SLACK_API_URL": fake.base_url,
        }
        made = Cluster(fake, kit, db, base, env)
        try:
            yield made
        finally:
            await made.stop_all()
