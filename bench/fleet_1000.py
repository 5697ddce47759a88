"""``/vllm gpus`` over 1,000 hosts: wall time, the bot's peak RSS, connections open at once.

    ./dev python bench/fleet_1000.py                 # 1,000 hosts, [fleet].max_connections 64
    ./dev python bench/fleet_1000.py --hosts 200 --limit 16

Each host is its own asyncssh server on 127.0.0.1 (its own port and host key, checked
strictly against its own known_hosts file; the bot logs in with one client key), all
served by one helper process so the servers' side of SSH is not on the event loop
measured. A host answers the bot's GPU read (both nvidia-smi queries, ``nvidia-smi -q``,
``journalctl -k``) with canned text (``bot.sim.canned_fleet``) inside the server: no
process per command, since on a real fleet that work is each host's own. Every 100th
host's port is closed (unreachable), every 250th (from the 7th) has a critical GPU.

What is measured, in this (the bot's) process: ``fleet_gpus`` on a fresh ``HostPool``
and the pool's close (cold: a new connection per host), then the Slack answer
(``fleet_summary_message``) and its file (``fleet_file``); peak RSS is this process's
``ru_maxrss`` after all of that (imports and settings included). Connections open at
once are counted by the servers (accepted and not yet closed), so what the bot opens is
measured from the other side.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncssh

from bot.hosts.base import HostTransport
from bot.hosts.fleet import fleet_gpus
from bot.hosts.fleet_states import HostState, fleet_file, fleet_states, summary_text
from bot.hosts.pool import HostPool
from bot.settings import Settings
from bot.sim import canned_fleet
from bot.slack.fleet_blocks import fleet_summary_message

QUERY_TIMEOUT_S = 10.0
_TIMEOUT_OPTS = 3  # "timeout --kill-after=10s 10s" before the bot's argv


def host_name(i: int) -> str:
    return f"gpu-node-{i:04d}"


def unreachable(i: int) -> bool:
    return i % 100 == 0


def critical(i: int) -> bool:
    return i % 250 == 7


class Counting(asyncssh.SSHServer):
    """Counts the connections open at once across every host's server."""

    open = 0
    max_open = 0
    accepted = 0

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        Counting.open += 1
        Counting.accepted += 1
        Counting.max_open = max(Counting.max_open, Counting.open)

    def connection_lost(self, exc: Exception | None) -> None:
        Counting.open -= 1


def handler(is_critical: bool) -> Any:
    def handle(process: asyncssh.SSHServerProcess[str]) -> None:
        argv = shlex.split(process.command or "")
        if argv[:1] == ["timeout"]:
            argv = argv[_TIMEOUT_OPTS:]
        out, err, status = canned_fleet.answer(argv, critical=is_critical)
        process.stdout.write(out)
        process.stderr.write(err)
        process.exit(status)

    return handle


async def serve(n: int, root: Path) -> None:
    """The helper: start N servers, print the hosts' settings, run until stdin closes,
    then print what the servers counted."""
    root.mkdir(parents=True, exist_ok=True)
    client = asyncssh.generate_private_key("ssh-ed25519")
    client_key = root / "client_key"
    client_key.write_bytes(client.export_private_key())
    client_key.chmod(0o600)
    authorized = asyncssh.import_authorized_keys(client.export_public_key().decode())
    servers: list[asyncssh.SSHAcceptor] = []
    hosts: dict[str, dict[str, Any]] = {}
    for i in range(1, n + 1):
        key = asyncssh.generate_private_key("ssh-ed25519")
        server = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_host_keys=[key],
            authorized_client_keys=authorized,
            server_factory=Counting,
            process_factory=handler(critical(i)),
            encoding="utf-8",
        )
        port = server.sockets[0].getsockname()[1]
        known = root / f"{i}.known_hosts"
        known.write_text(f"[127.0.0.1]:{port} {key.export_public_key().decode()}")
        servers.append(server)
        hosts[host_name(i)] = {
            "address": "127.0.0.1",
            "port": port,
            "user": "chatops",
            "key_file": str(client_key),
            "known_hosts": str(known),
        }
    # Closed only now that every server holds its port, so no later server is given the
    # port of an unreachable host (it would answer there, with another host key).
    for i, server in enumerate(servers, start=1):
        if unreachable(i):
            server.close()  # the port is closed: connect refused
            await server.wait_closed()
    print(json.dumps(hosts), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    print(json.dumps({"max_open": Counting.max_open, "accepted": Counting.accepted}), flush=True)
    for s in servers:
        s.close()


class CountingPool(HostPool):
    """Counts the bot's transports open at once: from ``_open`` until their ``close`` has
    finished (an upper bound on its SSH connections; one connects on its first command)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.open = self.max_open = 0

    def _open(self, name: str) -> HostTransport:
        t = super()._open(name)
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        inner = t.close

        async def close() -> None:
            await inner()
            self.open -= 1

        setattr(t, "close", close)  # noqa: B010  # an instance's method, for this count
        return t


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="fleet-1000-") as tmp:
        helper = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--serve",
            str(args.hosts),
            "--dir",
            tmp,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024,
        )
        assert helper.stdout is not None and helper.stdin is not None
        hosts = json.loads(await helper.stdout.readline())
        settings = Settings(
            hosts=hosts, fleet={"max_connections": args.limit}, db_path=Path("unused.db")
        )
        rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        pool = CountingPool(settings)
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        try:
            results = await fleet_gpus(settings, pool, sorted(hosts), QUERY_TIMEOUT_S)
        finally:
            await pool.close()
        t1 = time.perf_counter()
        cpu1 = time.process_time()
        msg = fleet_summary_message("GPUs: all hosts", results, "gpus.txt")
        body = fleet_file(results)
        t2 = time.perf_counter()
        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        helper.stdin.close()
        counted = json.loads(await helper.stdout.readline())
        await helper.wait()
        helper_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    states = fleet_states(results)
    return {
        "hosts": args.hosts,
        "limit": args.limit,
        "query_s": t1 - t0,
        "answer_s": t2 - t1,
        "bot_cpu_s": cpu1 - cpu0,
        # The servers' CPU in all (start-up and key generation included).
        "helper_cpu_s": helper_cpu.ru_utime + helper_cpu.ru_stime,
        "peak_rss_mib": rss_kib / 1024,
        "rss_before_query_mib": rss_before_kib / 1024,
        "max_open": counted["max_open"],
        "bot_max_open": pool.max_open,
        "accepted": counted["accepted"],
        "blocks": len(msg.blocks),
        "file_kib": len(body.encode()) / 1024,
        "states": {s.value: states.count(s) for s in HostState},
        "summary": summary_text(results, limit=3),
    }


def main(args: argparse.Namespace) -> None:
    row = asyncio.run(measure(args))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}; "
        f"asyncssh {asyncssh.__version__}"
    )
    print(row.pop("summary"), end="\n\n")
    print(
        "| hosts | limit | query s (cold) | bot CPU s in the query | answer s | peak RSS MiB "
        "| RSS before query MiB | open at once, bot's transports | open at once, servers' count "
        "| connections accepted | blocks | file KiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(
        f"| {row['hosts']} | {row['limit']} | {row['query_s']:.2f} | {row['bot_cpu_s']:.2f} "
        f"| {row['answer_s']:.2f} "
        f"| {row['peak_rss_mib']:.0f} | {row['rss_before_query_mib']:.0f} | {row['bot_max_open']} "
        f"| {row['max_open']} "
        f"| {row['accepted']} | {row['blocks']} | {row['file_kib']:.0f} |"
    )
    print(f"states: {row['states']}; the servers' helper used {row['helper_cpu_s']:.1f} s CPU")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--limit", type=int, default=64, help="[fleet].max_connections")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parsed = ap.parse_args()
    if parsed.serve is not None:
        asyncio.run(serve(parsed.serve, parsed.dir))
    else:
        main(parsed)
