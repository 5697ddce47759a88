"""An embedded SSH server for one simulated host: asyncssh on 127.0.0.1, any free port.

It behaves like the host's sshd as far as the engine can tell: public-key login
for one user with the kit's key, a throwaway ed25519 host key, each exec
request run as ``/bin/sh -c <command>`` with the simulated tools first on PATH,
output streamed as it comes, the exit status (or signal) passed back, and
port forwarding only to the host's loopback.  A channel that closes before its
command finished takes the command down with it.

A reboot (issue 23, ``bot.sim.power``) drops connections as a host going away does: a
command of a connection made before the reboot (the reboot's own included) ends with the
connection aborted, never its exit status, and while the host is booting every command
is dropped before it runs.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import cast

import asyncssh

from bot.sim import power, procfs
from bot.sim.state import STATE_DIR_ENV, StateStore

LOOPBACK = ("127.0.0.1", "localhost")
CHUNK = 65536


class _ExecSession(asyncssh.SSHServerSession[bytes]):
    def __init__(self, server: EmbeddedSshServer, boot_id: str) -> None:
        self._server = server
        self._boot_id = boot_id  # the host's boot when the connection was made
        self._chan: asyncssh.SSHServerChannel[bytes] | None = None
        self._command = ""
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._stdin: list[bytes | None] = []  # what arrived before the process existed

    def connection_made(self, chan: asyncssh.SSHServerChannel[bytes]) -> None:
        self._chan = chan

    def shell_requested(self) -> bool:
        return False  # the engine only ever runs commands

    def exec_requested(self, command: str) -> bool:
        self._command = command
        return True

    def session_started(self) -> None:
        self._task = asyncio.create_task(self._run())

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        self._feed(data)

    def eof_received(self) -> bool:
        self._feed(None)
        return True  # half-close: the command's output still has to come back

    def _feed(self, data: bytes | None) -> None:
        if self._proc is None or self._proc.stdin is None:
            self._stdin.append(data)
        elif data is None:
            self._proc.stdin.close()
        else:
            self._proc.stdin.write(data)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def signal_received(self, signal_name: str) -> None:
        sig = getattr(signal, f"SIG{signal_name}", None)
        if self._proc is not None and isinstance(sig, signal.Signals):
            self._server.signal_session(self._proc.pid, sig)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            if self._proc is not None:
                self._server.end_session(self._proc.pid)

    async def _pump(
        self, reader: asyncio.StreamReader | None, write: Callable[[bytes], None]
    ) -> None:
        assert reader is not None
        while chunk := await reader.read(CHUNK):
            await self._writable.wait()
            write(chunk)

    async def _run(self) -> None:
        chan = self._chan
        assert chan is not None
        if not await asyncio.to_thread(self._server.admits, self._boot_id):
            chan.get_connection().abort()  # a host that is not there: no exit status
            return
        proc = await asyncio.create_subprocess_exec(
            "/bin/sh",
            "-c",
            self._command,
            env={**self._server.env, power.EMBEDDED_ENV: "1"},
            cwd=self._server.cwd,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._proc = proc
        for data in self._stdin:
            self._feed(data)
        await asyncio.gather(
            self._pump(proc.stdout, chan.write), self._pump(proc.stderr, chan.write_stderr)
        )
        status = await proc.wait()
        if self._server.boot_id() != self._boot_id:
            chan.get_connection().abort()  # the host rebooted under this connection
            return
        if status < 0:
            chan.exit_with_signal(signal.Signals(-status).name.removeprefix("SIG"))
        else:
            chan.exit(status)


class _Server(asyncssh.SSHServer):
    def __init__(self, owner: EmbeddedSshServer) -> None:
        self._owner = owner
        self._conn: asyncssh.SSHServerConnection | None = None
        self._boot_id = owner.boot_id()

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self._conn = conn
        self._owner.connections.add(conn)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._owner.connections.discard(self._conn)

    def begin_auth(self, username: str) -> bool:
        # Only the kit's user has authorized keys; anyone else fails like on a real host.
        if username == self._owner.user and self._conn is not None:
            self._conn.set_authorized_keys(str(self._owner.authorized_keys))
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def session_requested(self) -> _ExecSession:
        return _ExecSession(self._owner, self._boot_id)

    def connection_requested(
        self, dest_host: str, dest_port: int, orig_host: str, orig_port: int
    ) -> Awaitable[asyncssh.SSHTCPSession[bytes]]:
        if dest_host not in LOOPBACK or self._conn is None:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"forwarding to {dest_host} is not permitted",
            )
        # A refused connect comes back to the client as "Connection refused", as from sshd.
        port = self._owner.port_map.get(dest_port, dest_port)
        # The same forwarder asyncssh itself returns for `True`, and cast the same way.
        return cast(
            Awaitable[asyncssh.SSHTCPSession[bytes]],
            self._conn.forward_connection("127.0.0.1", port),
        )


class EmbeddedSshServer:
    """Start with ``await EmbeddedSshServer.start(...)``; stop with ``await close()``.

    ``port_map`` lets many simulated hosts share one loopback: a forward to the
    service port the host claims (say 8000) reaches the port its server really has.
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str],
        cwd: Path,
        user: str,
        authorized_keys: Path,
        port_map: Mapping[int, int],
    ) -> None:
        self.env = env
        self.cwd = cwd
        self.user = user
        self.authorized_keys = authorized_keys
        self.port_map = port_map
        self.connections: set[asyncssh.SSHServerConnection] = set()
        self._host_key = asyncssh.generate_private_key("ssh-ed25519")
        self._acceptor: asyncssh.SSHAcceptor | None = None
        self._cleanups: set[asyncio.Future[None]] = set()
        self.port = 0

    @classmethod
    async def start(
        cls,
        *,
        env: Mapping[str, str],
        cwd: Path,
        user: str,
        authorized_keys: Path,
        port_map: Mapping[int, int],
    ) -> EmbeddedSshServer:
        server = cls(
            env=env, cwd=cwd, user=user, authorized_keys=authorized_keys, port_map=port_map
        )
        server._acceptor = await asyncssh.listen(
            "127.0.0.1",
            0,
            server_factory=lambda: _Server(server),
            server_host_keys=[server._host_key],
            encoding=None,
            allow_scp=False,
            agent_forwarding=False,
            x11_forwarding=False,
        )
        server.port = server._acceptor.get_port()
        return server

    @property
    def host_public_key(self) -> str:
        """``ssh-ed25519 AAAA...`` as known_hosts wants it."""
        key: bytes = self._host_key.export_public_key("openssh")
        return " ".join(key.decode().split()[:2])

    def boot_id(self) -> str:
        """The host's boot id now ("" for a host with no state directory)."""
        directory = self.env.get(STATE_DIR_ENV)
        return power.read_boot_id(Path(directory)) if directory else ""

    def admits(self, boot_id: str) -> bool:
        """Whether a command of a connection made in boot ``boot_id`` may run: the host
        is up (a finished boot brings it up: ``power.settle``) and has not rebooted."""
        directory = self.env.get(STATE_DIR_ENV)
        if directory and not power.settle(StateStore(Path(directory))):
            return False
        return self.boot_id() == boot_id

    def signal_session(self, sid: int, sig: signal.Signals) -> None:
        procfs.signal_all(procfs.session_members(sid), sig)

    def end_session(self, sid: int) -> None:
        """Terminate what a dropped channel left running (``timeout`` takes its own
        process group, so the whole session is ended, not just the group)."""
        fut = asyncio.get_running_loop().run_in_executor(
            None, lambda: procfs.terminate(procfs.session_members(sid))
        )
        self._cleanups.add(fut)
        fut.add_done_callback(self._cleanups.discard)

    async def close(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
            await self._acceptor.wait_closed()
        for conn in list(self.connections):
            conn.close()
            await conn.wait_closed()
        await asyncio.gather(*self._cleanups)
