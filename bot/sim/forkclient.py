"""What ``bot/sim/bin/<tool>`` runs: one simulated tool call, through the fork server.

Each call of a simulated tool used to be a fresh interpreter importing the simulator:
about 80 ms of CPU, most of an end-to-end test's. When ``SIM_FORK_SOCKET`` names a fork
server (``bot.sim.forkserver``) of this same user, this client hands it the call (its
arguments, environment, working directory, umask and its own stdin, stdout and stderr)
and stands in for the tool until it ends: a signal this process receives goes to the
tool, and it exits the way the tool did (the same status, or the same signal). Without a
server, or another user's, the tool runs here, in this process, as before.

So that starting this costs little, it imports only modules built into the interpreter
(no ``socket``, ``signal`` or ``json``: each would pull ``enum`` in).
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; ``signal`` imports enum
import _socket
import os
import sys

SOCKET_ENV = "SIM_FORK_SOCKET"
CATCH = (1, 2, 3, 10, 12, 14, 15)  # SIGHUP INT QUIT USR1 USR2 ALRM TERM: forwarded


def _connect(path: str) -> _socket.socket | None:
    """A connection to this user's fork server, or None (then the tool runs here)."""
    try:
        if os.stat(path).st_uid != os.geteuid():
            return None  # another user's server would run the tool with its rights
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    except OSError:
        return None
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    return s


def _via(s: _socket.socket, argv: list[str]) -> None:
    umask = os.umask(0)
    os.umask(umask)
    # NUL-separated, as no argument, variable or path can hold a NUL: umask, cwd, argc,
    # the arguments, then the environment's NAME=value entries.
    data = b"\0".join(
        [
            str(umask).encode(),
            os.fsencode(os.getcwd()),
            str(len(argv)).encode(),
            *map(os.fsencode, argv),
            *(k + b"=" + v for k, v in os.environb.items()),
        ]
    )
    fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))
    s.sendmsg(
        [len(data).to_bytes(8, "big") + data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)]
    )

    def forward(signo: int, _frame: object) -> None:
        try:
            s.send(bytes([signo]))
        except OSError:
            pass

    for signo in CATCH:
        _signal.signal(signo, forward)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = s.recv(64)  # retried after a forwarded signal (PEP 475)
        if not chunk:
            os.write(2, b"simulated tool: the fork server went away\n")
            os._exit(255)
        reply += chunk
    how, _, value = reply.decode().strip().partition(" ")
    code = int(value)
    if how == "signal":
        # Die of the same signal, as the tool did: the caller sees what it would have.
        _signal.signal(code, _signal.SIG_DFL)
        os.kill(os.getpid(), code)
        os._exit(128 + code)
    os._exit(code)


def main() -> None:
    argv = sys.argv[1:]
    path = os.environ.get(SOCKET_ENV)
    s = _connect(path) if path else None
    if s is not None:
        _via(s, argv)
    del sys.path[0]  # this file's directory: its modules must not shadow the stdlib
    from bot.sim.tools import main as run

    raise SystemExit(run(argv))


if __name__ == "__main__":
    main()
