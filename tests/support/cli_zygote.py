"""``python -m bot`` for the tests, as a fork of an interpreter that has already imported
the bot: starting one cost about 0.8 s of CPU (asyncssh, cryptography, pydantic, the
settings), more than most runs' own work, and the suite starts about a hundred.

    conn = zygote_start(argv, env=..., cwd=..., stdin=fd, stdout=fd, stderr=fd)
    code = await zygote_wait(conn)

One server per test process (started on first use, ended with it). Each run is a fork:
the child takes the given descriptors as 0, 1 and 2, the environment, the working
directory and ``sys.argv``, then runs ``bot`` as ``__main__`` (``runpy``), exactly as
``python -m bot`` does; its exit status (or signal) comes back on the connection. A fork
of a process that only imported is a fresh process in every way the bot can tell: its
own PID and start time (the run owner), ``random`` reseeded at fork, no threads, no
event loop, nothing buffered. The server was started with plain pipes as stdio, as the
tests give the CLI (stdout and stderr pipes; stdin /dev/null or a terminal, whose
``isatty`` is asked of the descriptor). ``CLI_NO_FORK=1`` runs real interpreters.

Runs here: ``python -c 'from tests.support.cli_zygote import serve; serve(...)'``.
"""

from __future__ import annotations

import array
import asyncio
import atexit
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
_started: tuple[int, Path, subprocess.Popen[bytes]] | None = None


def enabled() -> bool:
    return not os.environ.get("CLI_NO_FORK")


def _socket_path() -> Path:
    """This process's server (started on first use); clients wait until it listens."""
    global _started
    if _started is not None and _started[0] == os.getpid():
        return _started[1]
    path = Path(tempfile.mkdtemp(prefix="cli-zygote-")) / "socket"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from tests.support.cli_zygote import serve; import sys; "
            "serve(sys.argv[1], int(sys.argv[2]))",
            str(path),
            str(os.getpid()),
        ],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    _started = (os.getpid(), path, proc)
    atexit.register(_stop, proc, path)
    return path


def _stop(proc: subprocess.Popen[bytes], path: Path) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
    path.unlink(missing_ok=True)
    path.parent.rmdir()


def zygote_start(
    argv: list[str], *, env: dict[str, str], cwd: Path, stdin: int, stdout: int, stderr: int
) -> socket.socket:
    """Hand ``python -m bot *argv`` to the server; the descriptors are passed (the
    caller may close its own at once). ``zygote_wait`` the connection for its end."""
    path = _socket_path()
    deadline = 30 / 0.01
    while not path.exists():
        if _started is not None and _started[2].poll() is not None:
            raise RuntimeError(f"the CLI fork server ended: {_started[2].communicate()!r}")
        deadline -= 1
        if deadline < 0:
            raise RuntimeError("the CLI fork server never listened")
        time.sleep(0.01)
    request = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(str(path))
        fds = array.array("i", [stdin, stdout, stderr])
        conn.sendmsg(
            [len(request).to_bytes(8, "big") + request],
            [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())],
        )
    except BaseException:
        conn.close()
        raise
    conn.setblocking(False)
    return conn


async def zygote_wait(conn: socket.socket) -> int:
    """The run's exit status as asyncio gives it (-N: killed by signal N)."""
    try:
        reply = b""
        loop = asyncio.get_running_loop()
        while not reply.endswith(b"\n"):
            chunk = await loop.sock_recv(conn, 64)
            if not chunk:
                raise RuntimeError("the CLI fork server hung up before the run ended")
            reply += chunk
    finally:
        conn.close()
    how, _, value = reply.decode().strip().partition(" ")
    return -int(value) if how == "signal" else int(value)


# ---- the server ---------------------------------------------------------------------------


def _recv(conn: socket.socket) -> tuple[list[int], dict[str, object]]:
    fds: list[int] = []
    data, ancdata, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(3 * 4))
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", raw[: len(raw) - len(raw) % 4]).tolist()
    size = int.from_bytes(data[:8], "big")
    body = data[8:]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("truncated request")
        body += chunk
    request: dict[str, object] = json.loads(body)
    return fds, request


def _child(fds: list[int], request: dict[str, object], keep_closed: list[int]) -> None:
    """The run itself: become ``python -m bot`` with the caller's stdio, env and cwd."""
    code = 1
    try:
        import runpy

        for fd in keep_closed:
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        time.tzset()
        os.chdir(str(request["cwd"]))
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = ["-m", *argv]  # runpy sets argv[0] to the module's file, as -m does
        try:
            runpy.run_module("bot", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
    except BaseException:  # whatever happens, this process must exit here
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    os._exit(code)


def _waiter(
    conn: socket.socket, fds: list[int], request: dict[str, object], listener: socket.socket
) -> None:
    """A fork that forks the run, waits for it and says how it ended; a caller that
    hangs up (a test cancelled) takes its run with it."""
    code = 1
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the server's SIG_IGN: reap here
        pid = os.fork()
        if pid == 0:
            _child(fds, request, [conn.fileno()])
        for fd in fds:
            os.close(fd)
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            readable, _, _ = select.select([conn], [], [], 0.05)
            if readable and not conn.recv(1):
                os.kill(pid, signal.SIGKILL)
        if os.WIFSIGNALED(status):
            reply = f"signal {os.WTERMSIG(status)}\n"
        else:
            reply = f"exit {os.WEXITSTATUS(status)}\n"
        conn.sendall(reply.encode())
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    os._exit(code)


def serve(path: str, parent: int) -> None:
    # What bot/__main__.py imports, which each run would otherwise pay for (not that
    # module itself: runpy warns when it runs a module already imported).
    import bot.cli.main
    import bot.settings
    import bot.slack.app  # noqa: F401  (the Slack bot's own imports: replicas, issue 21)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.new"
    listener.bind(staging)
    listener.listen(64)
    os.replace(staging, path)  # clients find it only once it listens
    listener.settimeout(1.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the waiters reap themselves
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        try:
            conn.settimeout(10)
            fds, request = _recv(conn)
            conn.settimeout(None)
        except (OSError, ValueError):
            conn.close()
            continue
        if os.fork() == 0:
            _waiter(conn, fds, request, listener)
        for fd in fds:
            os.close(fd)
        conn.close()
