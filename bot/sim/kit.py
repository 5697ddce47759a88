"""SimKit: one simulated GPU host, laid out in a directory and reachable over SSH.

    async with SimKit(tmp_path, config=fast_config()) as kit:      # embedded asyncssh
        settings = load_settings(path, **kit.settings_fragment())
        kit.set_faults(stuck_worker=True)
        ... run the engine ...
        assert [c.argv[:2] for c in kit.calls()] == [...]

``access="sshd"`` serves the same host through a real OpenSSH sshd instead.
``link=True`` puts a ``FaultyLink`` (a TCP proxy that can drop, black-hole or
refuse connections) between the engine and either server: ``kit.link.drop()``.
Each kit has its own state directory, ports, keys and server, so a fleet is
just N kits (see ``fleet_fragment``).

A host reboots (``systemctl reboot``, bot.sim.power) like a real one: the connection
drops, logins fail until the boot is over (``reboot_delay_s``, or ``kit.end_boot()``),
then the enabled unit starts; ``kit.boot_id()``, ``kit.reboots()`` and ``kit.is_up()``
say where it is. ``kit.persistence(i)`` and ``kit.resets()`` follow ``nvidia-smi -pm``
and ``-r``.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import asyncssh

from bot.sim import forkclient, forkserver, kernel, power, procfs, vllm_server
from bot.sim import packages as sim_packages
from bot.sim.fastclient import FAST_CLIENT_ENV, fast_client
from bot.sim.link import FaultyLink
from bot.sim.server import EmbeddedSshServer
from bot.sim.sshd import SshdServer, free_port
from bot.sim.state import (
    DEFAULT_VERSION,
    STATE_DIR_ENV,
    VENV_SET,
    Call,
    Faults,
    HostConfig,
    HostState,
    SimGpu,
    SimProcess,
    StateStore,
    booted_at,
    format_journal,
    host_view,
    is_down,
    persistence_of,
    unit_state,
)
from bot.sim.tools import BOOT, TOOLS, unit
from bot.sim.tools import uv as sim_uv

Access = Literal["embedded", "sshd"]
BIN_DIR = Path(__file__).resolve().parent / "bin"
CLIENT = Path(forkclient.__file__).resolve()
REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICE = "kimi-k25"
# vLLM's nightly index, and PyTorch's index of the CUDA 12.9 build (the one a host whose
# driver is 12.x needs, now that PyPI's default torch is a CUDA 13 build).
INDEXES = {
    "nightly": "https://wheels.vllm.ai/nightly",
    "cu129": "https://download.pytorch.org/whl/cu129",
}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
READY_TIMEOUT_S = 10.0

# Sub-second host timings, so a whole redeploy against the simulator takes about a second.
FAST_TIMINGS: dict[str, Any] = {
    "release_delay_s": 0.3,
    "load_delay_s": 0.3,
    "fail_delay_s": 0.1,
    "stop_delay_s": 0.05,
    "install_duration_s": 0.3,
    "reboot_delay_s": 0.5,
    "gpu_reset_s": 0.05,
}
# Engine settings scaled to those timings. Each drain or health poll is a few commands
# over SSH (sshd, a shell, `timeout` and a tool call each): polling every 0.1 s, a test's
# longer waits spent about a sixth more CPU on a 2-core machine that the suite keeps busy,
# for the same wall time; every 0.25 s still sees each simulated phase several times.
TEST_SERVICE_SETTINGS: dict[str, Any] = {
    "drain_threshold_mib": 1024,
    "drain_timeout_s": 5.0,
    "drain_poll_s": 0.25,
    "start_timeout_s": 10.0,
    "health_poll_s": 0.25,
    "stop_timeout_s": 10.0,
    "install_timeout_s": 30.0,
    "command_timeout_s": 10.0,
    "min_free_disk_mib": 64,
}
# The readiness keys for the simulated server: its model, and a smoke test it passes.
READY_SETTINGS: dict[str, Any] = {
    "served_model": "kimi-k2.5",
    "smoke_prompt": "The capital of France is",
    "smoke_expect": "Paris",
}
# What the bot's build writes last into a side-by-side release (bot.core.remote's
# RELEASE_MARK; a test keeps them equal): the kit's first release is a complete one.
RELEASE_MARK = ".chatops-release"
TEST_HOST_SETTINGS: dict[str, Any] = {
    "connect_timeout_s": 5.0,
    "keepalive_interval_s": 1.0,
    "keepalive_count_max": 3,
}


def fast_config(**overrides: Any) -> HostConfig:
    """A HostConfig with FAST_TIMINGS; any knob can still be overridden."""
    return HostConfig(**{**FAST_TIMINGS, **overrides})


class SimKit:
    """One simulated host: state directory, keys, fake vLLM server and SSH access."""

    def __init__(
        self,
        root: Path,
        *,
        config: HostConfig | None = None,
        installed_version: str | None = DEFAULT_VERSION,
        running: bool = True,
        access: Access = "embedded",
        venv_dir: Path | None = None,
        service_port: int | None = None,
        link: bool = False,
        user: str | None = None,
        side_by_side: bool = False,
    ) -> None:
        """Nothing starts until ``start()`` (or ``async with``).

        venv_dir: where the service's venv is (default ``<root>/venv``); hosts of one
        fleet share a path, as the settings give a service one ``python``.
        service_port: the port the host claims to serve on (default: the free port
        its fake server really binds).  Only the embedded server can map a claimed
        port onto the real one, which is what lets hosts of a fleet share one.
        link: reach the server through a ``FaultyLink`` (``self.link``); ``port`` is
        then the link's, so settings and known_hosts name the path the engine takes.
        side_by_side: the venv's path is a symlink to a release in ``<venv>.releases``
        (issue 20), built as the bot builds one (``uv venv``, then its set installed).
        """
        self.root = root.resolve()
        self.config = config if config is not None else HostConfig()
        self.access: Access = access
        self.state_dir = self.root / "state"
        self.venv_dir = (venv_dir if venv_dir is not None else self.root / "venv").resolve()
        self.python = self.venv_dir / "bin" / "python"
        self.client_key = self.root / "client_key"
        self.authorized_keys = self.root / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"
        # The account the bot logs in as: another than this process's only behind a real
        # sshd started as root (tests of a non-root host).
        self.user = user or getpass.getuser()
        self.health_port = free_port()
        if access == "sshd" and service_port not in (None, self.health_port):
            raise ValueError("sshd forwards to real ports: service_port cannot be remapped")
        self.service_port = service_port if service_port is not None else self.health_port
        self.store = StateStore(self.state_dir)
        self.port = 0  # the SSH port, once started
        self._want_link = link
        self._link: FaultyLink | None = None
        self._installed = installed_version
        self._running = running
        self._side_by_side = side_by_side
        self._server: EmbeddedSshServer | SshdServer | None = None

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> SimKit:
        self._lay_out()
        if self._running:
            await self._boot()
            await self._wait_listening()
        if self.access == "sshd":
            self._server = await SshdServer.start(
                self.root / "sshd",
                authorized_keys=self.authorized_keys,
                env=self.env(),
                user=self.user,
                sim_root=self.sim_root(),
            )
        else:
            self._server = await EmbeddedSshServer.start(
                env=self.env(),
                cwd=Path.home(),
                user=self.user,
                authorized_keys=self.authorized_keys,
                port_map={self.service_port: self.health_port},
            )
        self.port = self._server.port
        if self._want_link:
            self._link = await FaultyLink.start(self._server.port)
            self.port = self._link.port
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {self._server.host_public_key}\n")
        return self

    async def close(self) -> None:
        """Stop the SSH server and every process this host started. Safe to call twice."""
        if self._link is not None:
            await self._link.close()
            self._link = None
        if self._server is not None:
            await self._server.close()
            self._server = None
        await asyncio.to_thread(self._end_processes)

    def _end_processes(self) -> None:
        # Commands a real sshd left running after their channel closed, and the fake
        # servers, all carry the host's state directory in their environment.
        procfs.terminate(procfs.with_env(STATE_DIR_ENV, str(self.state_dir)))
        # Model servers forked by the fork server carry its environment, not the host's.
        vllm_server.stop_all(self.state_dir)

    async def __aenter__(self) -> SimKit:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _boot(self) -> None:
        """``unit.boot`` through the fork server (``bot.sim.tools.BOOT``): its model
        server is then a fork of a loaded interpreter, not a new one (about 80 ms of CPU
        of a kit's 100). Run here instead where no client can be built."""
        client = fast_client()
        if client is None:
            unit.boot(self.store)
            return
        proc = await asyncio.create_subprocess_exec(
            str(client),
            "-S",
            str(CLIENT),
            BOOT,
            # The Python client runs the tool itself until the server listens.
            env={**self.env(), "PYTHONPATH": str(REPO_ROOT)},
            cwd=self.root,
            stdin=asyncio.subprocess.DEVNULL,
        )
        if await proc.wait() != 0:
            raise RuntimeError(f"the simulated host {self.hostname} did not boot")

    def _lay_out(self) -> None:
        for tool in TOOLS:
            if not os.access(BIN_DIR / tool, os.X_OK):
                raise RuntimeError(f"{BIN_DIR / tool} is not executable (chmod +x it)")
        self.root.mkdir(parents=True, exist_ok=True)
        env = sim_packages.deps_of(self._installed or DEFAULT_VERSION)
        if self._side_by_side:
            self._lay_out_release(env)
        self.python.parent.mkdir(parents=True, exist_ok=True)
        if not self.python.exists():
            # `df` on the venv is real, so the directory must be. The interpreter runs the
            # simulated one (bot.sim.tools.python) of whichever host's state the caller's
            # environment names, so hosts of a fleet can share this file.
            self.python.write_text(
                "#!/bin/sh\n# Simulated venv interpreter (bot/sim/tools/python.py).\n"
                f'if [ -x "${{{FAST_CLIENT_ENV}:-}}" ]; then\n'
                f'  PYTHONPATH="{REPO_ROOT}" exec "${FAST_CLIENT_ENV}" -S "{CLIENT}" python "$@"\n'
                "fi\n"
                f'PYTHONPATH="{REPO_ROOT}" exec "${{SIM_PYTHON:-python3}}" -S '
                f'"{CLIENT}" python "$@"\n'
            )
            self.python.chmod(0o755)
        key = asyncssh.generate_private_key("ssh-ed25519", comment="sim-client")
        # Created 0600 from the start: ssh refuses a private key others can read.
        fd = os.open(self.client_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.export_private_key())
        public = key.export_public_key("openssh")
        self.client_key.with_suffix(".pub").write_bytes(public)
        self.authorized_keys.write_bytes(public)
        # The venv was installed with uv on this host: its wheels are in uv's cache.
        cached = [
            *(sim_packages.pin(n, v) for n, v in env.items()),
            *([sim_packages.pin("vllm", self._installed)] if self._installed else []),
        ]
        self.store.create(
            HostState(
                config=self.config,
                venv=str(self.venv_dir),
                health_port=self.health_port,
                service_port=self.service_port,
                owner_pid=os.getpid(),
                installed_version=self._installed,
                packages=env,
                cache=tuple(cached),
                boot_version=self._installed,
            )
        )
        power.write_boot_id(self.store, self.store.read().boot_id)

    def _lay_out_release(self, env: dict[str, str]) -> None:
        """The first release, as the bot builds one, and the venv's link to it."""
        if self.venv_dir.is_symlink() or self.venv_dir.exists():
            return  # hosts of a fleet share the path; the first kit made it
        name = f"{self._installed or 'none'}-{'0' * 12}"
        rel = self.releases_dir / name
        sim_uv.make_venv(rel)
        full = {**env, **({"vllm": self._installed} if self._installed else {})}
        (rel / VENV_SET).write_text(json.dumps(full))
        (rel / RELEASE_MARK).write_text(name + "\n")
        self.venv_dir.symlink_to(rel)

    def sim_root(self) -> Path:
        """A tree ``bot.sim`` is importable from, that the login account can read (the
        sshd wrapper's reboot check runs from it)."""
        return REPO_ROOT

    @property
    def releases_dir(self) -> Path:
        return Path(f"{self.venv_dir}.releases")

    def live_release(self) -> str | None:
        """The release the venv's link points at now (None: not a link)."""
        if not self.venv_dir.is_symlink():
            return None
        return Path(os.readlink(self.venv_dir)).name

    def releases(self) -> list[str]:
        """The release directories, by name."""
        d = self.releases_dir
        return sorted(p.name for p in d.iterdir()) if d.is_dir() else []

    async def _wait_listening(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.health_port)
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"simulated vLLM server never listened on {self.health_port}"
                    ) from None
                await asyncio.sleep(0.02)
            else:
                writer.close()
                await writer.wait_closed()
                return

    async def connect(self, **options: Any) -> asyncssh.SSHClientConnection:
        """A client connection the way the engine makes one: the kit's key and strict
        known_hosts (``options`` override, e.g. ``known_hosts=`` another file)."""
        kwargs: dict[str, Any] = {
            "username": self.user,
            "client_keys": [str(self.client_key)],
            "known_hosts": str(self.known_hosts),
            **options,
        }
        conn: asyncssh.SSHClientConnection = await asyncssh.connect(
            "127.0.0.1", self.port, **kwargs
        )
        return conn

    @property
    def link(self) -> FaultyLink:
        """The link in front of the server (only with ``link=True``)."""
        if self._link is None:
            raise RuntimeError("this kit has no link: create it with link=True")
        return self._link

    # --- the host's environment and settings ---------------------------------------------

    def env(self) -> dict[str, str]:
        """The environment a login on this host gets: run the tools directly with it."""
        env = {
            "PATH": f"{BIN_DIR}:{SYSTEM_PATH}",
            STATE_DIR_ENV: str(self.state_dir),
            "SIM_PYTHON": sys.executable,
            "HOME": str(Path.home()),
            "USER": self.user,
            "LOGNAME": self.user,
            "SHELL": "/bin/sh",
            "LANG": "C.UTF-8",
            # Each tool call is a fork of a server that has the simulator imported
            # (bot.sim.forkserver): a fresh interpreter per call was most of a test's CPU.
            forkclient.SOCKET_ENV: str(forkserver.shared_socket()),
        }
        # And its client compiled (bot/sim/fastclient.py): the interpreter each call
        # started was, after the polls, the largest part of the suite's CPU.
        if (client := fast_client()) is not None:
            env[FAST_CLIENT_ENV] = str(client)
        if "TZ" in os.environ:
            env["TZ"] = os.environ["TZ"]
        return env

    @property
    def hostname(self) -> str:
        return self.config.hostname

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.service_port}/health"

    def host_settings(self, **overrides: Any) -> dict[str, Any]:
        return {
            "address": "127.0.0.1",
            "port": self.port,
            "user": self.user,
            "key_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            **TEST_HOST_SETTINGS,
            **overrides,
        }

    def service_settings(
        self, hosts: Sequence[str] | None = None, **overrides: Any
    ) -> dict[str, Any]:
        # The leftover script runs ps and kill by the absolute paths the settings give
        # (it finds nothing through PATH): here, the simulated ones.
        return {
            "hosts": list(hosts) if hosts is not None else [self.hostname],
            "unit": self.config.unit,
            "python": str(self.python),
            "health_url": self.health_url,
            "indexes": dict(INDEXES),
            "ps": str(BIN_DIR / "ps"),
            "kill": str(BIN_DIR / "kill"),
            **TEST_SERVICE_SETTINGS,
            **overrides,
        }

    def settings_fragment(
        self, *, service: str = SERVICE, **service_overrides: Any
    ) -> dict[str, Any]:
        """``hosts`` and ``services`` for ``load_settings(path, **fragment)``."""
        return {
            "hosts": {self.hostname: self.host_settings()},
            "services": {service: self.service_settings(**service_overrides)},
        }

    # --- faults and knobs ----------------------------------------------------------------

    def set_faults(self, **flags: bool) -> Faults:
        """Flip fault switches (names as in ``Faults``); takes effect on the next tool call."""
        # A hardware fault logs the Xid a real driver logs for it (bot.sim.kernel).
        before = self.state()
        kernel.on_faults(self.store, before.config, before.faults, replace(before.faults, **flags))
        with self.store.transaction() as tx:
            st = replace(tx.state, faults=replace(tx.state.faults, **flags))
            if flags.get("busy") and not tx.state.faults.busy:
                st = replace(st, busy_since=time.time())  # its requests start now
            tx.state = st
            return tx.state.faults

    def clear_faults(self) -> None:
        with self.store.transaction() as tx:
            tx.state = replace(tx.state, faults=Faults())

    def update_config(self, **changes: Any) -> HostConfig:
        """Change knobs (names as in ``HostConfig``) while the host is up."""
        with self.store.transaction() as tx:
            tx.state = replace(tx.state, config=replace(tx.state.config, **changes))
            self.config = tx.state.config
            return self.config

    def set_installed_version(self, version: str | None) -> None:
        with self.store.transaction() as tx:
            tx.state = replace(tx.state, installed_version=version)

    # --- what the host looks like now ----------------------------------------------------

    def state(self) -> HostState:
        power.settle(self.store)  # a rebooted host whose boot is over comes up
        return self.store.read()

    @property
    def faults(self) -> Faults:
        return self.state().faults

    @property
    def installed_version(self) -> str | None:
        return self.state().installed_version

    def unit_state(self) -> str:
        """systemd's ActiveState right now: active, deactivating, inactive or failed."""
        return unit_state(self.state().run, time.time())[0]

    def gpus(self) -> list[SimGpu]:
        return host_view(self.state(), time.time())[0]

    def processes(self) -> list[SimProcess]:
        return host_view(self.state(), time.time())[1]

    def calls(self, tool: str | None = None) -> list[Call]:
        """Every simulated tool invocation so far, oldest first (``http`` = a request
        the fake vLLM server answered)."""
        return [c for c in self.store.calls() if tool is None or c.tool == tool]

    def changes(self) -> list[str]:
        """The state-changing calls that reached the host, in order: ``stop``, ``start``,
        ``dry-run``, ``prefetch`` (an install into a throwaway venv: only uv's cache
        changes), ``install`` and ``rollback`` (``uv pip sync`` of a snapshot, or an
        install of one pinned package)."""
        out = []
        for c in self.calls():
            a = c.argv
            if a[:2] in (("systemctl", "stop"), ("systemctl", "start")):
                out.append(a[1])
            elif a[:3] == ("uv", "pip", "sync"):
                out.append("rollback")
            elif a[:3] == ("uv", "pip", "install"):
                out.append(
                    "dry-run"
                    if "--dry-run" in a
                    else "build"
                    if any(".releases/" in x for x in a)
                    else "prefetch"
                    if str(self.python) not in a
                    else "rollback"
                    if "--reinstall-package" in a
                    else "install"
                )
        return out

    def environment(self) -> dict[str, str]:
        """Every installed package and its version, vllm included (what a freeze lists)."""
        return sim_packages.environment(self.state())

    def cached(self) -> set[str]:
        """The wheels in uv's cache, as ``name==version``."""
        return set(self.state().cache)

    def kernel_message(self, text: str) -> None:
        """Add a line to the kernel log (``journalctl -k``), stamped now."""
        kernel.append(self.store, text)

    def signalled(self) -> list[tuple[str, int]]:
        """Every signal sent to a process of this host, oldest first: (signal, PID)."""
        out = []
        for c in self.calls("kill"):
            a = list(c.argv[1:])
            sig = a[1] if a[:1] == ["-s"] else a[0].lstrip("-") if a else ""
            out += [(sig, int(p)) for p in a if p.isdigit() and p != sig]
        return out

    def dead(self) -> set[int]:
        """The simulated PIDs a signal ended."""
        return set(self.state().dead)

    # --- reboot, persistence mode and GPU resets (issue 23, bot.sim.power) ----------------

    def boot_id(self) -> str:
        """What ``cat /proc/sys/kernel/random/boot_id`` prints, without the newline."""
        return self.state().boot_id

    def reboots(self) -> int:
        """How many times ``systemctl reboot`` ran."""
        return self.state().reboots

    def is_up(self) -> bool:
        """False while a reboot is in progress (every SSH login drops); a finished boot
        comes up here (its enabled unit starts, timed from when the boot ended)."""
        return not is_down(self.state(), time.time())

    def end_boot(self) -> bool:
        """End a reboot's boot now (the config's delays stay as they are, for the next
        reboot); True when the host is up (never under reboot_hangs)."""
        with self.store.transaction() as tx:
            st = tx.state
            if st.boot_pending and st.rebooted_at is not None:
                up = booted_at(st)
                assert up is not None
                tx.state = replace(st, rebooted_at=st.rebooted_at - max(up - time.time(), 0.0))
        return self.is_up()

    def persistence(self, index: int) -> bool:
        """GPU ``index``'s persistence mode (``nvidia-smi -pm``)."""
        return persistence_of(self.state(), index)

    def set_persistence(self, index: int, on: bool) -> None:
        with self.store.transaction() as tx:
            st = tx.state
            modes = [persistence_of(st, i) for i in range(st.config.gpus)]
            modes[index] = on
            tx.state = replace(st, persistence=tuple(modes))

    def resets(self) -> list[int]:
        """The GPUs ``nvidia-smi -r`` reset, in order."""
        return list(self.state().resets)

    def unit_enabled(self) -> bool:
        """Whether the unit starts at boot (``systemctl enable|disable``)."""
        return self.state().unit_enabled

    def set_unit_enabled(self, on: bool) -> None:
        with self.store.transaction() as tx:
            tx.state = replace(tx.state, unit_enabled=on)

    def kernel_log(self) -> list[str]:
        """This boot's kernel log (``journalctl -k``): a reboot starts it empty."""
        return kernel.lines(self.store, self.hostname, None)

    def journal(self) -> list[str]:
        """The journal as ``journalctl`` would print it right now."""
        now, host = time.time(), self.hostname
        return [format_journal(e, host) for e in self.store.journal() if e.ts <= now]


def fleet_fragment(
    kits: Sequence[SimKit], *, service: str = SERVICE, **service_overrides: Any
) -> dict[str, Any]:
    """Settings for one service spread over several kits.

    The kits must share ``venv_dir`` and ``service_port`` (a service has one
    python and one health_url), so build them with the same values for both.
    """
    first = kits[0]
    for k in kits[1:]:
        if (k.python, k.service_port) != (first.python, first.service_port):
            raise ValueError("fleet kits must share venv_dir and service_port")
    return {
        "hosts": {k.hostname: k.host_settings() for k in kits},
        "services": {
            service: first.service_settings([k.hostname for k in kits], **service_overrides)
        },
    }
