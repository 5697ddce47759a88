"""A fork server for the simulated tools: the simulator imported once, a fork per call.

``bot.sim.forkclient`` (what ``bot/sim/bin/<tool>`` runs) connects to it over a Unix
socket and passes the call: arguments, environment, working directory, umask and its
stdin, stdout and stderr (``SCM_RIGHTS``). The server forks; the child takes those as
its own and runs the tool exactly as a fresh interpreter would, writing straight to the
caller's pipes. When the child ends, the client is told how (``exit N`` or ``signal N``)
and ends the same way. A signal the client receives arrives here as one byte and goes to
the child; a client that vanishes (SIGKILL) takes its child with it.

One server serves every simulated host of the process that started it (the hosts differ
only in the environment each call brings); it ends when that process does. The server is
single-threaded, as ``fork`` requires: one ``select`` loop over the listening socket, the
clients and a ``SIGCHLD`` wake-up pipe.
"""

from __future__ import annotations

import atexit
import importlib
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from bot.sim import procfs
from bot.sim.forkclient import SOCKET_ENV
from bot.sim.state import STATE_DIR_ENV
from bot.sim.tools import TOOLS, VENV_TOOLS
from bot.sim.tools import main as run_tool

__all__ = ["SOCKET_ENV", "serve", "server_pid", "shared_socket"]

MODULE = "bot.sim.forkserver"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
MAX_REQUEST = 1 << 20  # arguments and environment: far below this
PARENT_CHECK_S = 1.0  # how soon the server notices that its parent process has gone

_started: tuple[int, Path, subprocess.Popen[bytes]] | None = None


def shared_socket() -> Path:
    """This process's fork server (started on first use): the socket to name in
    ``SIM_FORK_SOCKET``. Until it listens, clients run their tool themselves."""
    global _started
    if _started is not None and _started[0] == os.getpid():
        return _started[1]
    path = Path(tempfile.mkdtemp(prefix="sim-fork-")) / "socket"
    env = dict(os.environ, PYTHONPATH=str(PROJECT_ROOT), LANG="C.UTF-8")
    # Not this process's hosts' (the kit ends the processes that carry a state directory).
    env.pop(SOCKET_ENV, None)
    env.pop(STATE_DIR_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, "-S", "-m", MODULE, str(path), str(os.getpid())],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        close_fds=True,
    )
    _started = (os.getpid(), path, proc)
    atexit.register(_stop, proc, path)
    return path


def server_pid() -> int | None:
    """This process's fork server, if it started one (its children are the tools)."""
    return _started[2].pid if _started is not None and _started[0] == os.getpid() else None


def _stop(proc: subprocess.Popen[bytes], path: Path) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
    path.unlink(missing_ok=True)
    path.parent.rmdir()


@dataclass
class _Call:
    conn: socket.socket
    pid: int


def _recv_request(conn: socket.socket) -> tuple[list[int], bytes]:
    """The passed descriptors and the marshalled request (length-prefixed)."""
    fds: list[int] = []
    data, ancdata, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += [
                int.from_bytes(raw[i : i + 4], sys.byteorder)
                for i in range(0, len(raw) - len(raw) % 4, 4)
            ]
    if len(data) < 8:
        raise ValueError("short request")
    size = int.from_bytes(data[:8], "big")
    if size > MAX_REQUEST:
        raise ValueError("request too large")
    body = data[8:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("truncated request")
        body += chunk
    return fds, body


def _decode(body: bytes) -> tuple[list[str], dict[bytes, bytes], bytes, int]:
    """``bot.sim.forkclient``'s request: arguments, environment, cwd and umask."""
    umask, cwd, argc, *rest = body.split(b"\0")
    n = int(argc)
    env = dict(e.partition(b"=")[::2] for e in rest[n:])
    return [os.fsdecode(a) for a in rest[:n]], env, cwd, int(umask)


def _peer(conn: socket.socket) -> tuple[int, int]:
    """The client's pid and uid, from the kernel (``SO_PEERCRED``)."""
    pid, uid, _gid = struct.unpack(
        "3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    )
    return pid, uid


def _child(client: int, fds: list[int], body: bytes, keep_closed: list[int]) -> None:
    """In the forked child: become the caller's tool process, run the tool, exit."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in keep_closed:
            os.close(fd)
        argv, env, cwd, umask = _decode(body)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        os.chdir(cwd)
        os.umask(umask)
        # Not ``clear()``: MutableMapping's pops one item at a time, each through a new
        # iterator: three times as long as deleting the keys listed once (93 against
        # 31 us for the 40-odd variables of a test process), on every tool call.
        for key in list(os.environb):
            del os.environb[key]
        os.environb.update(env)
        time.tzset()  # TZ may differ from the server's
        sys.argv = [MODULE, *argv]
        procfs.stand_for(client)  # `pgrep` leaves itself out, as the real one does
        code = _run(argv)
    except BaseException:  # whatever happens, this process must exit here
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(code)


def _run(argv: list[str]) -> int:
    try:
        return run_tool(argv)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # As an interpreter would: die of SIGINT.
        sys.stdout.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        return 130


class _Server:
    def __init__(self, listener: socket.socket, parent: int) -> None:
        self.listener = listener
        self.parent = parent
        self.sel = selectors.DefaultSelector()
        self.calls: dict[int, _Call] = {}  # child pid -> call
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the pipe is written
        self.sel.register(listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "child")

    def serve(self) -> None:
        while os.getppid() == self.parent:
            for key, _ in self.sel.select(PARENT_CHECK_S):
                if key.data == "accept":
                    self._accept()
                elif key.data == "child":
                    self._reap()
                else:
                    self._from_client(key.data)

    def _open_fds(self) -> list[int]:
        # A call whose client vanished keeps its entry until its child is reaped, with its
        # connection closed already (fileno -1): the child must not try to close that.
        return [
            self.listener.fileno(),
            self.wake_r,
            self.wake_w,
            *(fd for c in self.calls.values() if (fd := c.conn.fileno()) >= 0),
        ]

    def _accept(self) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            client, uid = _peer(conn)
            if uid != os.geteuid():
                raise ValueError("another user's call")  # never run with our rights
            conn.settimeout(5.0)
            fds, body = _recv_request(conn)
            conn.settimeout(None)
            if len(fds) != 3:
                raise ValueError("expected stdin, stdout and stderr")
            pid = os.fork()
            if pid == 0:
                _child(client, fds, body, [*self._open_fds(), conn.fileno()])
        except (OSError, ValueError):
            conn.close()  # the client sees the server go away and says so
            return
        finally:
            for fd in fds:
                os.close(fd)
        call = _Call(conn, pid)
        self.calls[pid] = call
        self.sel.register(conn, selectors.EVENT_READ, call)

    def _from_client(self, call: _Call) -> None:
        try:
            data = call.conn.recv(64)
        except OSError:
            data = b""
        if not data:
            # The client died without being told (SIGKILL): so does its tool. Its entry
            # stays until the child is reaped, so that a reused pid is never signalled.
            self._signal(call.pid, signal.SIGKILL)
            self._hang_up(call)
            return
        for signo in data:
            self._signal(call.pid, signo)

    def _signal(self, pid: int, signo: int) -> None:
        if pid in self.calls:
            try:
                os.kill(pid, signo)
            except ProcessLookupError:
                pass

    def _reap(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            call = self.calls.pop(pid, None)
            if call is None:
                continue
            how = (
                f"signal {os.WTERMSIG(status)}"
                if os.WIFSIGNALED(status)
                else f"exit {os.waitstatus_to_exitcode(status)}"
            )
            if call.conn.fileno() >= 0:
                try:
                    call.conn.sendall(f"{how}\n".encode())
                except OSError:
                    pass
            self._hang_up(call)

    def _hang_up(self, call: _Call) -> None:
        if call.conn.fileno() >= 0:
            self.sel.unregister(call.conn)
            call.conn.close()


def preload() -> None:
    """Import every tool now, so that no call pays for it."""
    for module in {**TOOLS, **VENV_TOOLS}.values():
        importlib.import_module(f"bot.sim.tools.{module}")


def serve(path: Path, parent: int) -> None:
    preload()
    path.parent.mkdir(mode=0o700, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = path.with_name(path.name + ".new")
    staging.unlink(missing_ok=True)
    listener.bind(str(staging))
    listener.listen(256)
    os.replace(staging, path)  # clients find it only once it listens
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        _Server(listener, parent).serve()
    finally:
        path.unlink(missing_ok=True)


if __name__ == "__main__":
    serve(Path(sys.argv[1]), int(sys.argv[2]))
