"""A real OpenSSH ``sshd`` serving one simulated host on 127.0.0.1.

It runs in the foreground (``-D -e``) with its own config, host key and
authorized_keys, and a ``ForceCommand`` wrapper that puts the simulated tools
first on PATH before running the client's command with ``/bin/sh -c``, which
is what the user's login shell does on a real host.  Readiness is sshd's own
"Server listening on" line, not a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import shlex
import socket
import subprocess
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from bot.sim import power, procfs

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = "ssh-keygen"
PRIVSEP_DIR = Path("/run/sshd")
START_TIMEOUT_S = 10.0
PORT_ATTEMPTS = 3
SIM_ROOT = Path(__file__).resolve().parents[2]  # where `bot.sim` is importable from


def free_port() -> int:
    """A port nothing listens on right now (the caller binds it soon after)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _q(path: Path) -> str:
    return f'"{path}"'  # sshd_config's own quoting, for paths with spaces


def _config(port: int, host_key: Path, authorized_keys: Path, command: Path, user: str) -> str:
    return f"""\
Port {port}
ListenAddress 127.0.0.1
HostKey {_q(host_key)}
PidFile none
AuthorizedKeysFile {_q(authorized_keys)}
AuthenticationMethods publickey
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
AllowUsers {user}
AllowTcpForwarding local
PermitOpen 127.0.0.1:* localhost:*
AllowAgentForwarding no
X11Forwarding no
PermitTTY no
PermitUserEnvironment no
PrintMotd no
PrintLastLog no
# bash sources ~/.bashrc in every command sshd starts when SHLVL says it is the first
# shell (bash's SSH_SOURCE_BASHRC); a root ~/.bashrc that runs `pyenv init` then costs
# 150 ms and 30 processes per command. The session wrapper sets its own environment.
SetEnv SHLVL=1
MaxSessions 64
MaxStartups 200
LogLevel INFO
ForceCommand {shlex.quote(str(command))}
"""


# While a reboot is in progress (bot.sim.power.MARKER in the state directory), the
# wrapper asks the simulator whether the host is up before it runs anything; while it is
# down, the check kills this connection's sshd session (the client loses the connection,
# as with a host that is not there). The fast path is one `test -e` per command.
_GATE = (
    'if [ -e "$SIM_STATE_DIR/{marker}" ]; then\n'
    '  if [ -x "${{SIM_FORK_CLIENT:-}}" ]; then\n'
    '    PYTHONPATH={root} "$SIM_FORK_CLIENT" -S {client} {gate} || exit 255\n'
    "  else\n"
    '    PYTHONPATH={root} "${{SIM_PYTHON:-python3}}" -S {client} {gate} || exit 255\n'
    "  fi\n"
    "fi\n"
)


def _wrapper(env: Mapping[str, str], sim_root: Path = SIM_ROOT) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    client = shlex.quote(str(sim_root / "bot" / "sim" / "forkclient.py"))
    gate = _GATE.format(
        marker=power.MARKER, gate=power.GATE_TOOL, root=shlex.quote(str(sim_root)), client=client
    )
    return f'#!/bin/sh\n{exports}{gate}exec /bin/sh -c "$SSH_ORIGINAL_COMMAND"\n'


def _prepare(
    workdir: Path, env: Mapping[str, str], sim_root: Path = SIM_ROOT
) -> tuple[Path, str, Path]:
    """Host key, its public half, and the ForceCommand wrapper."""
    workdir.mkdir(parents=True, exist_ok=True)
    host_key = workdir / "ssh_host_ed25519_key"
    if not host_key.exists():
        subprocess.run(
            [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "sim-host", "-f", str(host_key)],
            check=True,
            stdin=subprocess.DEVNULL,
        )
    public = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])
    command = workdir / "session.sh"
    command.write_text(_wrapper(env, sim_root))
    command.chmod(0o755)
    if os.geteuid() == 0:
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)  # sshd refuses to start without it
    return host_key, public, command


class SshdServer:
    """Start with ``await SshdServer.start(...)``; stop with ``await close()``."""

    def __init__(
        self, proc: asyncio.subprocess.Process, port: int, host_public_key: str, log: deque[str]
    ) -> None:
        self._proc = proc
        self.port = port
        self.host_public_key = host_public_key
        self._log = log
        self._drain: asyncio.Task[None] | None = None

    @property
    def log(self) -> list[str]:
        """sshd's recent stderr lines, for a test's failure message."""
        return list(self._log)

    @classmethod
    async def start(
        cls,
        workdir: Path,
        *,
        authorized_keys: Path,
        env: Mapping[str, str],
        user: str | None = None,
        sim_root: Path = SIM_ROOT,
    ) -> SshdServer:
        """``user``: the one account that may log in (default: this process's); another
        one needs this process to be root, as sshd must switch to it. ``sim_root``: a
        tree ``bot.sim`` is importable from that the login can read (the reboot check)."""
        host_key, public, command = await asyncio.to_thread(_prepare, workdir, env, sim_root)
        config = workdir / "sshd_config"
        log: deque[str] = deque(maxlen=200)
        for _ in range(PORT_ATTEMPTS):
            port = free_port()
            text = _config(port, host_key, authorized_keys, command, user or getpass.getuser())
            await asyncio.to_thread(config.write_text, text)
            proc = await asyncio.create_subprocess_exec(
                str(SSHD),
                "-D",
                "-e",
                "-f",
                str(config),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
            if await _listening(proc, port, log):
                server = cls(proc, port, public, log)
                server._drain = asyncio.create_task(_drain(proc, log))
                return server
            await proc.wait()
            if not any("Address already in use" in line for line in log):
                break
        raise RuntimeError("sshd did not start:\n" + "\n".join(log))

    async def close(self) -> None:
        # Per-connection children run in sessions of their own: find them before the
        # listener goes, while they are still its descendants.
        pids = [self._proc.pid, *procfs.descendants(self._proc.pid)]
        await asyncio.get_running_loop().run_in_executor(None, procfs.terminate, pids)
        await self._proc.wait()
        if self._drain is not None:
            self._drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._drain


async def _listening(proc: asyncio.subprocess.Process, port: int, log: deque[str]) -> bool:
    """Wait for sshd to say it listens on `port`; False if it exits first."""
    assert proc.stderr is not None
    ready = f"Server listening on 127.0.0.1 port {port}"
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while line := await proc.stderr.readline():
                log.append(line.decode(errors="replace").rstrip())
                if ready in log[-1]:
                    return True
    except TimeoutError:
        proc.kill()
        log.append(f"(no '{ready}' within {START_TIMEOUT_S:g}s)")
    return False


async def _drain(proc: asyncio.subprocess.Process, log: deque[str]) -> None:
    # sshd logs every login to stderr; an unread pipe would eventually block it.
    assert proc.stderr is not None
    while line := await proc.stderr.readline():
        log.append(line.decode(errors="replace").rstrip())
