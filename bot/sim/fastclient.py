"""The C fast path of the simulated tools' client (``bot/sim/forkclient.c``), built once
per source version and user with the machine's C compiler.

A simulated tool call was a ``python -S`` start (about 8 ms of CPU) before the fork
server's own work; the end-to-end tests make tens of thousands of them. The compiled
client does the same hand-over in well under a millisecond. Without a compiler (or if
the build fails) nothing changes: ``fast_client()`` is None and the tools' wrappers run
the Python client, which stays the reference (the C one falls back to it whenever it
cannot hand the call over).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

SOURCE = Path(__file__).resolve().with_name("forkclient.c")
# What ``bot/sim/bin/<tool>`` runs instead of the Python client when it names a program.
FAST_CLIENT_ENV = "SIM_FORK_CLIENT"


@cache
def fast_client() -> Path | None:
    """The compiled client (built on first use), or None where it cannot be built."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None or os.environ.get("SIM_NO_FAST_CLIENT"):
        return None
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    home = Path(tempfile.gettempdir()) / f"sim-forkclient-{os.geteuid()}"
    binary = home / f"forkclient-{digest}"
    try:
        home.mkdir(mode=0o700, exist_ok=True)
        info = home.stat()
        if info.st_uid != os.geteuid() or info.st_mode & 0o022:
            return None  # not ours alone: another user could swap the program
        if os.access(binary, os.X_OK):
            return binary
        # Built under a unique name, then renamed: workers building at once each get a
        # whole program.
        fd, partial = tempfile.mkstemp(dir=home, prefix=".build-")
        os.close(fd)
        done = subprocess.run(
            [compiler, "-O2", "-o", partial, str(SOURCE)], capture_output=True, timeout=60
        )
        if done.returncode != 0:
            os.unlink(partial)
            return None
        os.replace(partial, binary)
    except (OSError, subprocess.SubprocessError):
        return None
    return binary
