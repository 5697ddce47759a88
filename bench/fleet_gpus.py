"""Fleet GPU query: the bot's fan-out vs a bare asyncssh gather vs Ansible ad-hoc.

    ./dev python bench/fleet_gpus.py                      # sizes 1,8,32,64; canned + sim
    ./dev python bench/fleet_gpus.py --sizes 8 --remote sim --ansible skip

N simulated hosts, each its own embedded SSH server (asyncssh on 127.0.0.1, its
own port, host key and client key), all served by one helper process so the
servers' side of SSH does not share an event loop with the clients measured.

What each column runs against the same N hosts, with the same argv (the bot's
two nvidia-smi queries, wrapped in coreutils ``timeout`` as the bot wraps them):

- bot cold: ``fleet_gpus`` on a fresh ``HostPool`` (a new SSH connection per host).
- bot warm: ``fleet_gpus`` again on the same pool (pooled connections).
- bare: ``asyncio.gather`` over hosts of asyncssh connect + both queries at once
  on that connection + close; the floor for a cold query in Python.
- bare warm: the same two queries on already open asyncssh connections.
- ansible: ``ansible all -m command -a '<gpu query>'`` (only the first of the two
  queries: the command module runs one command), pipelining on, OpenSSH with the
  host's key checked strictly against the kit's known_hosts, a fresh ControlPath
  directory per run (so cold), at the default forks (5) and at forks=N.

``--remote canned``: the hosts' nvidia-smi is a shell script printing fixed CSV
(8 GPUs, 8 vLLM workers), so the numbers are the cost of SSH and the fan-out.
``--remote sim``: the simulator's nvidia-smi, a Python process (~45 ms of CPU
each); here every "host" runs on the same 2 cores, so remote work that a real
fleet does in parallel on N machines is serialised and dominates.

ansible-core is not a project dependency: it is installed once into a throwaway
venv under ~/.cache/vllm-chatops-bench (``--ansible PATH`` to use another
``ansible`` binary, ``--ansible skip`` to leave it out).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import asyncssh

from bot.core import remote
from bot.hosts.fleet import fleet_gpus
from bot.hosts.pool import HostPool
from bot.hosts.streams import wrap_with_timeout
from bot.settings import Settings
from bot.sim.kit import SimKit, fast_config

ANSIBLE_SPEC = "ansible-core==2.19.*"
ANSIBLE_VENV = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    / "vllm-chatops-bench"
    / "ansible-core"
)
QUERY_TIMEOUT_S = 60.0
MIN_ROUND_TIME_S = 3.0
COMMANDS = (remote.gpu_query(), remote.apps_query())

# --------------------------------------------------------------------------- the fleet

CANNED_GPUS = "".join(
    f"{i}, GPU-6f3c0d2a-{i:04d}-4b8e-9d1c-5a7e2f0b{i:04d}, NVIDIA H200, 97000, 143771, 87\n"
    for i in range(8)
)
CANNED_APPS = "".join(
    f"{48221 + i}, VLLM::Worker_TP{i}, 96998 MiB, GPU-6f3c0d2a-{i:04d}-4b8e-9d1c-5a7e2f0b{i:04d}\n"
    for i in range(8)
)
CANNED_SMI = """#!/bin/sh
# Canned nvidia-smi for the fleet benchmark: the bot's two queries, fixed output.
case "$1" in
  --query-gpu=*) exec cat "${0%/*}/gpus.csv" ;;
  --query-compute-apps=*) exec cat "${0%/*}/apps.csv" ;;
  *) echo "canned nvidia-smi: unsupported arguments: $*" >&2; exit 2 ;;
esac
"""


def write_canned(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "gpus.csv").write_text(CANNED_GPUS)
    (directory / "apps.csv").write_text(CANNED_APPS)
    smi = directory / "nvidia-smi"
    smi.write_text(CANNED_SMI)
    smi.chmod(0o755)
    return directory


class CannedKit(SimKit):
    """A simulated host whose nvidia-smi is the canned script (first on its PATH)."""

    def __init__(self, root: Path, canned_bin: Path, **kwargs: Any) -> None:
        super().__init__(root, **kwargs)
        self.canned_bin = canned_bin

    def env(self) -> dict[str, str]:
        env = super().env()
        env["PATH"] = f"{self.canned_bin}:{env['PATH']}"
        return env


async def _delayed_pipe(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, delay_s: float
) -> None:
    """Copy src to dst, each chunk ``delay_s`` late; chunks keep their order and
    do not wait for each other, like packets on a long link."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not data:
                dst.close()
                return
            dst.write(data)
            await dst.drain()

    sender = asyncio.create_task(send())
    try:
        while data := await src.read(65536):
            queue.put_nowait((loop.time() + delay_s, data))
    except ConnectionError:
        pass
    queue.put_nowait((loop.time() + delay_s, b""))
    await sender


async def delay_proxy(
    target_port: int, delay_s: float, tasks: set[asyncio.Task[Any]]
) -> asyncio.Server:
    """A loopback TCP proxy adding ``delay_s`` each way (a round trip of twice that).
    Its connection handlers go into ``tasks``, for the caller to end at shutdown."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(
            _delayed_pipe(reader, up_writer, delay_s),
            _delayed_pipe(up_reader, writer, delay_s),
            return_exceptions=True,
        )

    return await asyncio.start_server(handle, "127.0.0.1", 0)


async def serve(n: int, mode: str, root: Path, rtt_ms: float) -> None:
    """The helper process: start N hosts, print their settings, run until stdin closes."""
    canned = write_canned(root / "canned-bin")
    kits: list[SimKit] = []
    for i in range(1, n + 1):
        # running=False: no fake vLLM server per host (64 extra processes polling state);
        # the GPU queries do not need it.
        kw: dict[str, Any] = {"config": fast_config(hostname=f"gpu-node-{i:02d}"), "running": False}
        kits.append(
            CannedKit(root / f"h{i}", canned, **kw)
            if mode == "canned"
            else SimKit(root / f"h{i}", **kw)
        )
    proxies: list[asyncio.Server] = []
    piping: set[asyncio.Task[Any]] = set()
    try:
        await asyncio.gather(*(k.start() for k in kits))
        hosts = {k.hostname: k.host_settings() for k in kits}
        if rtt_ms > 0:
            for k in kits:
                proxy = await delay_proxy(k.port, rtt_ms / 2000, piping)
                proxies.append(proxy)
                port = proxy.sockets[0].getsockname()[1]
                # The same host key, now known under the proxy's port.
                known = root / f"{k.hostname}.known_hosts"
                key = k.known_hosts.read_text().split(" ", 1)[1]
                known.write_text(f"[127.0.0.1]:{port} {key}")
                hosts[k.hostname] = k.host_settings(port=port, known_hosts=str(known))
        print(json.dumps({"hosts": hosts, "envs": {k.hostname: k.env() for k in kits}}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    finally:
        for proxy in proxies:
            proxy.close()
        for task in list(piping):
            task.cancel()
        await asyncio.gather(*piping, return_exceptions=True)
        await asyncio.gather(*(k.close() for k in kits), return_exceptions=True)


class Fleet:
    """Runs ``serve`` in a helper process; ``hosts`` are the hosts' settings."""

    def __init__(self, n: int, mode: str, root: Path, rtt_ms: float = 0.0) -> None:
        self.args = (
            sys.executable,
            __file__,
            "--serve",
            str(n),
            "--remote",
            mode,
            "--dir",
            str(root),
            "--rtt-ms",
            str(rtt_ms),
        )
        self.proc: asyncio.subprocess.Process | None = None
        self.hosts: dict[str, dict[str, Any]] = {}
        self.envs: dict[str, dict[str, str]] = {}

    async def __aenter__(self) -> Fleet:
        self.proc = await asyncio.create_subprocess_exec(
            *self.args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=16 * 1024 * 1024,
        )
        assert self.proc.stdout is not None
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the fleet helper exited before its hosts were up")
        fleet = json.loads(line)
        self.hosts, self.envs = fleet["hosts"], fleet["envs"]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        await self.proc.wait()

    @property
    def settings(self) -> Settings:
        return Settings(hosts=self.hosts, db_path=Path("unused.db"))


# --------------------------------------------------------------------------- the contenders


async def remote_work_alone(fleet: Fleet) -> float:
    """Both queries of every host as plain local processes, no SSH: what the "remote"
    side costs on this machine (a real fleet spends it on N machines in parallel)."""

    async def one(env: dict[str, str], argv: Sequence[str]) -> None:
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            wrap_with_timeout(argv, QUERY_TIMEOUT_S),
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"local query failed: {proc.returncode}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one(env, argv) for env in fleet.envs.values() for argv in COMMANDS))
    return time.perf_counter() - t0


async def bot_cold_warm(fleet: Fleet) -> tuple[float, float]:
    settings = fleet.settings
    names = list(fleet.hosts)
    pool = HostPool(settings)
    try:
        t0 = time.perf_counter()
        cold = await fleet_gpus(settings, pool, names, QUERY_TIMEOUT_S)
        t1 = time.perf_counter()
        warm = await fleet_gpus(settings, pool, names, QUERY_TIMEOUT_S)
        t2 = time.perf_counter()
    finally:
        await pool.close()
    for r in cold + warm:
        if r.snapshot is None or len(r.snapshot.gpus) != 8:
            raise RuntimeError(f"bot query of {r.host} failed: {r.error}")
    return t1 - t0, t2 - t1


def _connect(h: dict[str, Any]) -> Awaitable[asyncssh.SSHClientConnection]:
    return asyncssh.connect(
        h["address"],
        h["port"],
        username=h["user"],
        client_keys=[h["key_file"]],
        known_hosts=h["known_hosts"],
        agent_path=None,
        config=None,
    )


async def _both(conn: asyncssh.SSHClientConnection) -> None:
    results = await asyncio.gather(
        *(conn.run(wrap_with_timeout(a, QUERY_TIMEOUT_S)) for a in COMMANDS)
    )
    # An idle host lists no compute apps: only the GPU query must print something.
    if any(r.exit_status != 0 for r in results) or not results[0].stdout:
        raise RuntimeError(f"bare query failed: {[(r.exit_status, r.stderr) for r in results]}")


async def bare_cold_warm(fleet: Fleet) -> tuple[float, float]:
    hosts = list(fleet.hosts.values())
    conns: list[asyncssh.SSHClientConnection] = []

    async def one(h: dict[str, Any]) -> None:
        conn = await _connect(h)
        conns.append(conn)
        await _both(conn)

    try:
        t0 = time.perf_counter()
        await asyncio.gather(*map(one, hosts))
        # Not counting the close (a one-shot script would pay it too): the strictest floor.
        t1 = time.perf_counter()
        await asyncio.gather(*map(_both, conns))
        t2 = time.perf_counter()
    finally:
        for c in conns:
            c.close()
        await asyncio.gather(*(c.wait_closed() for c in conns))
    return t1 - t0, t2 - t1


# --------------------------------------------------------------------------- ansible


def find_ansible(choice: str) -> Path | None:
    if choice == "skip":
        return None
    if choice != "auto":
        return Path(choice)
    ansible = ANSIBLE_VENV / "bin" / "ansible"
    if not ansible.exists():
        uv = shutil.which("uv")
        if uv is None:
            raise SystemExit("ansible: uv is not on PATH; pass --ansible PATH or skip")
        print(f"installing {ANSIBLE_SPEC} into {ANSIBLE_VENV} (one time)...", file=sys.stderr)
        subprocess.run(
            [uv, "venv", "--quiet", "--python", sys.executable, str(ANSIBLE_VENV)], check=True
        )
        subprocess.run(
            [
                uv,
                "pip",
                "install",
                "--quiet",
                "--python",
                str(ANSIBLE_VENV / "bin" / "python"),
                ANSIBLE_SPEC,
            ],
            check=True,
        )
    return ansible


class Ansible:
    def __init__(self, binary: Path, fleet: Fleet, work: Path) -> None:
        self.binary = binary
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        lines = ["[fleet]"]
        for name, h in fleet.hosts.items():
            ssh_args = shlex.join(
                [
                    "-o",
                    f"UserKnownHostsFile={h['known_hosts']}",
                    "-o",
                    "GlobalKnownHostsFile=/dev/null",
                    "-o",
                    "StrictHostKeyChecking=yes",
                    "-o",
                    "IdentitiesOnly=yes",
                    "-o",
                    "BatchMode=yes",
                ]
            )
            lines.append(
                f"{name} ansible_host={h['address']} ansible_port={h['port']} "
                f"ansible_user={h['user']} "
                f"ansible_ssh_private_key_file={h['key_file']} "
                f"ansible_ssh_common_args={shlex.quote(ssh_args)}"
            )
        self.inventory = work / "inventory.ini"
        self.inventory.write_text("\n".join(lines) + "\n")
        self.n = len(fleet.hosts)
        self.runs = 0

    def run(self, forks: int) -> float:
        """One ad-hoc run with a new ControlPath directory: every connection is new."""
        self.runs += 1
        cp = self.work / f"cp{self.runs}"
        cp.mkdir()
        cfg = self.work / f"ansible{self.runs}.cfg"
        cfg.write_text(
            "[defaults]\nhost_key_checking = True\nretry_files_enabled = False\n"
            f"interpreter_python = /usr/bin/python3\nlocal_tmp = {self.work / 'tmp'}\n"
            "[ssh_connection]\npipelining = True\n"
            "ssh_args = -C -o ControlMaster=auto -o ControlPersist=60s\n"
            f"control_path_dir = {cp}\n"
        )
        env = {
            **os.environ,
            "ANSIBLE_CONFIG": str(cfg),
            "ANSIBLE_HOME": str(self.work / "home"),
            "LANG": "C.UTF-8",
            "ANSIBLE_NOCOLOR": "1",
        }
        argv = [
            str(self.binary),
            "all",
            "-i",
            str(self.inventory),
            "-f",
            str(forks),
            "-m",
            "command",
            "-a",
            shlex.join(remote.gpu_query()),
        ]
        t0 = time.perf_counter()
        p = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - t0
        ok = p.stdout.count("| CHANGED | rc=0")
        if p.returncode != 0 or ok != self.n:
            raise RuntimeError(
                f"ansible: rc={p.returncode}, {ok}/{self.n} hosts ok\n"
                f"{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            )
        return elapsed

    def close_masters(self) -> None:
        for sock in self.work.glob("cp*/*"):
            subprocess.run(
                ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
                capture_output=True,
                check=False,
            )


# --------------------------------------------------------------------------- main


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


async def measure(
    n: int, mode: str, args: argparse.Namespace, ansible: Path | None, tmp: Path
) -> dict[str, Any]:
    row: dict[str, Any] = {"hosts": n, "remote": mode}
    async with Fleet(n, mode, tmp / f"{mode}-{n}", args.rtt_ms) as fleet:
        await bot_cold_warm(fleet)  # warm-up: imports, the servers' first sessions
        samples: dict[str, list[float]] = {
            k: [] for k in ("alone", "bot_cold", "bot_warm", "bare", "bare_warm")
        }
        # Small fleets take milliseconds: more rounds (up to MIN_ROUND_TIME_S in all),
        # or the median is noise.
        started = time.perf_counter()
        i = 0
        while i < args.repeats or (
            i < 128 // n and time.perf_counter() - started < MIN_ROUND_TIME_S
        ):

            async def bot() -> None:
                c, w = await bot_cold_warm(fleet)
                samples["bot_cold"].append(c)
                samples["bot_warm"].append(w)

            async def bare() -> None:
                c, w = await bare_cold_warm(fleet)
                samples["bare"].append(c)
                samples["bare_warm"].append(w)

            # Alternate who goes first so neither always follows the other's cleanup.
            order: list[Callable[[], Awaitable[None]]] = [bot, bare] if i % 2 == 0 else [bare, bot]
            for f in order:
                gc.collect()  # not in the middle of someone's round
                await f()
            samples["alone"].append(await remote_work_alone(fleet))
            i += 1
        row["rounds"] = i
        row.update({k: median(v) for k, v in samples.items()})
        if ansible is not None:
            a = Ansible(ansible, fleet, tmp / f"ansible-{mode}-{n}")
            try:
                for forks, key in ((5, "ansible_f5"), (n, "ansible_fN")):
                    row[key] = median(
                        [await asyncio.to_thread(a.run, forks) for _ in range(args.ansible_repeats)]
                    )
            finally:
                await asyncio.to_thread(a.close_masters)
    return row


def fmt(x: float) -> str:
    return f"{x:.3f}"


def print_table(rows: list[dict[str, Any]], with_ansible: bool) -> None:
    head = [
        "hosts",
        "rounds",
        "remote work alone s",
        "bot cold s",
        "bot warm s",
        "bare asyncssh s",
        "bare warm s",
    ]
    if with_ansible:
        head += ["ansible forks=5 s", "ansible forks=N s"]
    head += ["cold / bare", "warm / bare", "warm / bare, less remote work"]
    if with_ansible:
        head += ["ansible (best) / bot cold"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [
            str(r["hosts"]),
            str(r["rounds"]),
            fmt(r["alone"]),
            fmt(r["bot_cold"]),
            fmt(r["bot_warm"]),
            fmt(r["bare"]),
            fmt(r["bare_warm"]),
        ]
        if with_ansible:
            cells += [fmt(r["ansible_f5"]), fmt(r["ansible_fN"])]
        cells += [f"{r['bot_cold'] / r['bare']:.2f}x", f"{r['bot_warm'] / r['bare']:.2f}x"]
        # Only meaningful where SSH, not the remote command, is most of the time.
        net_bare = r["bare"] - r["alone"]
        cells.append(
            f"{(r['bot_warm'] - r['alone']) / net_bare:.2f}x" if net_bare > r["bare"] / 3 else "n/a"
        )
        if with_ansible:
            best = min(r["ansible_f5"], r["ansible_fN"])
            cells.append(f"{best / r['bot_cold']:.0f}x")
        print("| " + " | ".join(cells) + " |")


async def main(args: argparse.Namespace) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = ["canned", "sim"] if args.remote == "both" else [args.remote]
    ansible = find_ansible(args.ansible)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        for mode in modes:
            for n in sizes:
                # Ansible's own cost dwarfs the remote command: one mode is enough.
                use_ansible = ansible if mode == modes[0] else None
                row = await measure(n, mode, args, use_ansible, Path(tmp))
                rows.append(row)
                print(
                    f"# {mode} N={n}: "
                    + ", ".join(f"{k}={v:.3f}" for k, v in row.items() if isinstance(v, float)),
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; asyncssh {asyncssh.__version__}"
    )
    if ansible is not None:
        version = subprocess.run(
            [str(ansible), "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[:1]
        print(f"ansible: {' '.join(version)}")
    print(
        f"rounds: at least {args.repeats} (medians), ansible runs: {args.ansible_repeats}"
        f", added round trip: {args.rtt_ms:g} ms"
    )
    for mode in modes:
        mode_rows = [r for r in rows if r["remote"] == mode]
        print(f"\nremote = {mode}")
        print_table(mode_rows, with_ansible="ansible_f5" in mode_rows[0])


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sizes", default="1,8,32,64")
    ap.add_argument("--remote", choices=("canned", "sim", "both"), default="canned")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ansible", default="auto", help="auto | skip | path to `ansible`")
    ap.add_argument("--ansible-repeats", type=int, default=1)
    ap.add_argument(
        "--rtt-ms",
        type=float,
        default=0.0,
        help="add this round-trip time to every SSH connection (a delay proxy)",
    )
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    parsed = ap.parse_args()
    if parsed.serve is not None:
        asyncio.run(serve(parsed.serve, parsed.remote, parsed.dir, parsed.rtt_ms))
    else:
        asyncio.run(main(parsed))
