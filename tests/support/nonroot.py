"""A simulated GPU host reached as a non-root account, with the real sudo in front of its
tools: what the tests of ``become = "sudo"`` run against.

- Two accounts are created for each host (``useradd``, removed after): the login the
  bot uses, and the venv's owner. Creating them needs root, which CI has; locally a
  test without root is skipped with that reason.
- The real OpenSSH sshd logs the login account in; the real ``sudo`` (Debian's
  package) decides with a drop-in in /etc/sudoers.d written from
  ``bot.core.sudoers.render`` (checked with ``visudo -cf``, removed after).
- The simulated tools behind it run from a copy of ``bot/sim`` any account can read,
  through wrappers at absolute paths (what sudoers rules name) that hold the host's
  state directory themselves (sudo clears the environment). The wrappers refuse what a
  real host refuses an ordinary account: ``systemctl stop|start`` unless root (polkit's
  "Access denied"), the journal unless root, and writing the venv (``uv pip
  install|sync``) unless its owner. Without that, a test could pass with no sudo at all.
- Each account the tools run as (root, the login, the venv's owner) has its own fork
  server (``bot.sim.forkserver``, started as that account), which the wrappers hand the
  call to as the other end-to-end tests' tools do: a fresh interpreter per call cost
  about 64 ms of CPU, a fifth of the whole suite's. A server only takes calls from its
  own account, so a tool still runs with exactly the rights sudo gave its caller; where
  no server of the caller's account listens, the wrapper starts the interpreter as before.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.sim import packages as sim_packages
from bot.sim.fastclient import fast_client
from bot.sim.kit import BIN_DIR, RELEASE_MARK, SYSTEM_PATH, SimKit
from bot.sim.state import DEFAULT_VERSION, VENV_SET
from bot.sim.tools import TOOLS
from tests.support.sim import require_sshd

SUDOERS_D = Path("/etc/sudoers.d")
SUDOERS_LOCK = Path(tempfile.gettempdir()) / "vllm_chatops_test_sudoers.lock"
REPO_ROOT = BIN_DIR.parents[2]

# What each simulated tool refuses an ordinary account, as the real one on a host does.
# By absolute paths: a real systemctl or uv finds nothing through the caller's PATH.
_GUARDS = {
    # systemd 252 through polkit, for a user with no rule for the unit.
    "systemctl": (
        'case "$1" in stop|start) if [ "$(/usr/bin/id -u)" != 0 ]; then '
        'echo "Failed to $1 $3.service: Access denied" >&2; '
        "echo \"See system logs and 'systemctl status $3.service' for details.\" >&2; "
        "exit 4; fi;; esac\n"
    ),
    # journalctl 252 for a user outside the adm and systemd-journal groups.
    "journalctl": (
        'if [ "$(/usr/bin/id -u)" != 0 ]; then echo "Hint: You are currently not seeing '
        "messages from other users and the system. Users in groups 'adm', "
        "'systemd-journal' can see all messages. Pass -q to turn off this "
        'notice." >&2; echo "-- No entries --"; exit 0; fi\n'
    ),
    # uv writing a venv its account cannot write (uv 0.13: os error 13).
    "uv": (
        'case "$1 $2" in "pip install"|"pip sync") case " $* " in *" --dry-run "*) ;; '
        '*) if [ "$(/usr/bin/id -un)" != "{owner}" ]; then echo "error: failed to remove file '
        "\\`{venv}/lib/python3.12/site-packages/vllm/__init__.py\\`: Permission denied "
        '(os error 13)" >&2; exit 2; fi;; esac;; esac\n'
    ),
}


def require_root_and_sudo() -> None:
    """Skip without root (locally), fail in CI; likewise without sudo."""
    require_sshd()
    ci = bool(os.environ.get("CI"))
    if os.geteuid() != 0:
        if ci:
            pytest.fail("the non-root host tests need root (useradd, /etc/sudoers.d) in CI")
        pytest.skip("needs root: creates accounts and a sudoers drop-in")
    for tool in ("sudo", "visudo", "useradd", "runuser"):
        if shutil.which(tool) is None:
            if ci:
                pytest.fail(f"{tool} is missing and CI is set: install sudo (.ci/run)")
            pytest.skip(f"{tool} is not installed (apt-get install sudo)")


@dataclass(frozen=True)
class Accounts:
    login: str  # the account the bot logs in as
    owner: str  # the venv's owner


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )


def _checked(*argv: str) -> None:
    r = _run(*argv)
    if r.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")


@contextmanager
def accounts(base: Path) -> Iterator[Accounts]:
    """A login and a venv owner with unique names, homes under ``base``; removed after."""
    tag = secrets.token_hex(3)
    made = Accounts(login=f"vct{tag}", owner=f"vvt{tag}")
    created: list[str] = []
    try:
        for name in (made.login, made.owner):
            _checked("useradd", "-m", "-d", str(base / "home" / name), "-s", "/bin/sh", name)
            created.append(name)
        # Not locked ("*", no password): sshd without PAM refuses a locked account ("!").
        _checked("usermod", "-p", "*", made.login)
        yield made
    finally:
        for name in created:
            _run("userdel", "-f", "-r", name)


def usable_python(user: str) -> str:
    """A Python 3.11+ that ``user`` can run (the test's own may live under /root)."""
    candidates = ["/usr/bin/python3", shutil.which("python3"), os.path.realpath(sys.executable)]
    probe = "import sys; sys.exit(sys.version_info < (3, 11))"
    for python in dict.fromkeys(c for c in candidates if c):
        if _run("runuser", "-u", user, "--", python, "-S", "-c", probe).returncode == 0:
            return python
    pytest.fail(f"no Python 3.11+ that {user} can run: install python3")


def copy_sim(dest: Path) -> Path:
    """``bot/__init__.py`` and ``bot/sim`` (all the tools import) where anyone can read."""
    (dest / "bot").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "bot" / "__init__.py", dest / "bot" / "__init__.py")
    shutil.copytree(
        REPO_ROOT / "bot" / "sim",
        dest / "bot" / "sim",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    return dest


class NonRootKit(SimKit):
    """A SimKit behind the real sshd, logged into as ``accounts.login``; its tools at
    ``tool(name)`` (absolute paths, for the settings and the sudoers rules)."""

    def __init__(
        self,
        root: Path,
        *,
        who: Accounts,
        python: str,
        tree: Path,
        path_first: Path | None = None,
        keys_in_home: bool = False,
        **kwargs: Any,
    ) -> None:
        """``path_first``: a directory the login puts first in its PATH (its own tools).
        ``keys_in_home``: sshd reads the key from the login's own ~/.ssh/authorized_keys
        (OpenSSH's default place) instead of a file root owns."""
        super().__init__(root, access="sshd", user=who.login, **kwargs)
        self.who = who
        self.sim_python = python
        self.tree = tree
        self.tools = self.root / "tools"
        self.home = root.parent / "home" / who.login
        self.path_first = path_first
        self.keys_in_home = keys_in_home
        if keys_in_home:
            self.authorized_keys = self.home / ".ssh" / "authorized_keys"
        # The compiled fork client where the accounts can run it (None: no compiler).
        self._client: Path | None = None
        self._fork_servers: list[subprocess.Popen[bytes]] = []

    def tool(self, name: str) -> str:
        return str(self.tools / name)

    def _accounts(self) -> tuple[str, ...]:
        return ("root", self.who.login, self.who.owner)

    def _fork_socket(self, account: str) -> Path:
        return self.root / "fork" / account / "socket"

    def _fast_path(self, name: str) -> str:
        """The wrapper's lines that hand the call to the fork server of the account it
        runs as (``-O``: the socket is owned by this process's effective user, which is
        what the server checks too); the interpreter below runs it otherwise."""
        if self._client is None:
            return ""
        sockets = " ".join(shlex.quote(str(self._fork_socket(a))) for a in self._accounts())
        client = shlex.quote(str(self._client))
        script = shlex.quote(str(self.tree / "bot" / "sim" / "forkclient.py"))
        return (
            f"for s in {sockets}; do\n"
            '  if [ -S "$s" ] && [ -O "$s" ]; then SIM_FORK_SOCKET=$s; export SIM_FORK_SOCKET; '
            f'exec {client} -S {script} {name} "$@"; fi\n'
            "done\n"
        )

    def env(self) -> dict[str, str]:
        env = super().env()
        first = f"{self.path_first}:" if self.path_first is not None else ""
        env.update(
            PATH=f"{first}{self.tools}:{SYSTEM_PATH}",
            SIM_PYTHON=self.sim_python,
            HOME=str(self.home),
        )
        return env

    def _wrappers(self) -> None:
        self.tools.mkdir(parents=True, exist_ok=True)
        for name in TOOLS:
            guard = _GUARDS.get(name, "").format(owner=self.who.owner, venv=self.venv_dir)
            text = (
                "#!/bin/sh\n" + guard + "umask 000\n"  # every account shares the state
                f"SIM_STATE_DIR={shlex.quote(str(self.state_dir))}; "
                f"SIM_PYTHON={shlex.quote(self.sim_python)}; "
                f"PYTHONPATH={shlex.quote(str(self.tree))}; "
                "export SIM_STATE_DIR SIM_PYTHON PYTHONPATH\n"
                + self._fast_path(name)
                + f'exec "$SIM_PYTHON" -S -m bot.sim.tools {name} "$@"\n'
            )
            path = self.tools / name
            path.write_text(text)
            path.chmod(0o755)
        # The venv's interpreter (the import gate runs it as the venv's owner, under sudo,
        # which clears the environment: it names the host's state itself, like the tools).
        # Side by side: the venv's path is a link to the first release, which holds it.
        if self._side_by_side:
            rel = self.releases_dir / f"{DEFAULT_VERSION}-{'0' * 12}"
            env = {**sim_packages.deps_of(DEFAULT_VERSION), "vllm": DEFAULT_VERSION}
            (rel / "bin").mkdir(parents=True)
            (rel / VENV_SET).write_text(json.dumps(env))
            (rel / RELEASE_MARK).write_text(rel.name + "\n")
            self.venv_dir.symlink_to(rel)
        self.python.parent.mkdir(parents=True, exist_ok=True)
        self.python.write_text(
            "#!/bin/sh\numask 000\n"
            f"SIM_STATE_DIR={shlex.quote(str(self.state_dir))}; "
            f"PYTHONPATH={shlex.quote(str(self.tree))}; "
            "export SIM_STATE_DIR PYTHONPATH\n"
            f"exec {shlex.quote(self.sim_python)} -S -m bot.sim.tools "
            'python "$@"\n'
        )
        self.python.chmod(0o755)

    async def start(self) -> NonRootKit:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)
        self.authorized_keys.parent.mkdir(mode=0o700, exist_ok=True)
        # Bytecode beside the copy, by the interpreter the tools run: the accounts cannot
        # write __pycache__ there, so each tool call would compile every module it imports.
        _checked(self.sim_python, "-m", "compileall", "-q", str(self.tree))
        if (built := fast_client()) is not None:
            # Beside the host's files, root's and read-only to the accounts (the one in
            # the temporary directory is root's alone).
            self._client = self.root / "forkclient"
            shutil.copy(built, self._client)
            self._client.chmod(0o755)
        self._wrappers()
        await super().start()
        self._start_fork_servers()
        # The host's shared state: written by root (systemctl under sudo), the venv owner
        # (uv) and the login (nvidia-smi, pgrep) alike.
        self.state_dir.chmod(0o777)
        for p in self.state_dir.iterdir():
            p.chmod(0o666)
        # The venv and the bot's files beside it (snapshots, prefetch) are the owner's.
        beside = self.venv_dir.parent / ".chatops"
        beside.mkdir(exist_ok=True)
        for p in (self.venv_dir, beside):
            _checked("chown", "-R", f"{self.who.owner}:{self.who.owner}", str(p))
        if self._side_by_side:
            # The releases, and the directory the switch writes the new link in.
            for p in (self.releases_dir, self.venv_dir.parent):
                _checked("chown", "-R", f"{self.who.owner}:{self.who.owner}", str(p))
                p.chmod(0o755)
        # The key as the README installs it: no pty, no forwarding but to the model
        # server's port, only from the bot's address (sshd reads it at each login).
        key = self.authorized_keys.read_text().strip()
        self.authorized_keys.write_text(
            f'restrict,port-forwarding,permitopen="127.0.0.1:{self.service_port}",'
            f'from="127.0.0.1" {key}\n'
        )
        if self.keys_in_home:  # the login's own file, as ssh-copy-id leaves it
            _checked(
                "chown",
                "-R",
                f"{self.who.login}:{self.who.login}",
                str(self.authorized_keys.parent),
            )
        return self

    def _start_fork_servers(self) -> None:
        """One fork server per account, run as that account (``setpriv`` execs it, so it
        is this process's child and ends with it), importing the tools from the copy."""
        if self._client is None or shutil.which("setpriv") is None:
            return  # no socket: every wrapper starts the interpreter, as before
        env = {"PYTHONPATH": str(self.tree), "LANG": "C.UTF-8", "PATH": SYSTEM_PATH}
        for account in self._accounts():
            socket = self._fork_socket(account)
            socket.parent.mkdir(parents=True, mode=0o700)
            argv = [self.sim_python, "-S", "-m", "bot.sim.forkserver", str(socket)]
            argv.append(str(os.getpid()))
            if account != "root":
                _checked("chown", f"{account}:{account}", str(socket.parent))
                ids = ["--reuid", account, "--regid", account, "--init-groups"]
                argv = ["setpriv", *ids, "--", *argv]
            self._fork_servers.append(
                subprocess.Popen(
                    argv, env=env, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
                )
            )

    async def close(self) -> None:
        for proc in self._fork_servers:
            proc.terminate()
        for proc in self._fork_servers:
            await asyncio.to_thread(proc.wait)
        self._fork_servers.clear()
        await super().close()

    def service_settings(self, hosts: Any = None, **overrides: Any) -> dict[str, Any]:
        return super().service_settings(
            hosts,
            **{
                "uv": self.tool("uv"),
                "systemctl": self.tool("systemctl"),
                "journalctl": self.tool("journalctl"),
                "ps": self.tool("ps"),
                "kill": self.tool("kill"),
                "venv_user": self.who.owner,
                **overrides,
            },
        )

    def maintenance_settings(self) -> dict[str, Any]:
        """``[maintenance]`` naming this host's tools (host reboot and GPU reset)."""
        return {"systemctl": self.tool("systemctl"), "nvidia_smi": self.tool("nvidia-smi")}

    def host_settings(self, **overrides: Any) -> dict[str, Any]:
        # doctor reads the AuthorizedKeysFile of the sshd that serves this host.
        return super().host_settings(
            **{
                "become": "sudo",
                "sshd_config": str(self.root / "sshd" / "sshd_config"),
                **overrides,
            }
        )


# What a fixed script run with rights could find by name: the simulated tools, and the
# coreutils the scripts beside the venv use.
PLANTED = (
    "ps",
    "kill",
    "env",
    "sh",
    "cat",
    "mkdir",
    "mv",
    "rm",
    "stat",
    "readlink",
    "mktemp",
    "id",
    "dirname",
)


def plant_tools(directory: Path, marker: Path, kit_tools: Path, owner: str) -> None:
    """A login's own versions of ``PLANTED`` in ``directory`` (owned by ``owner``, as the
    login's own files are): each appends "<account> <name>" to ``marker``, then runs
    the real one (the simulated one where the host has it), so nothing else changes. A
    line from any account but the login means a command run with rights found it."""
    directory.mkdir(parents=True)
    marker.touch()
    marker.chmod(0o666)  # every account appends to it
    for name in PLANTED:
        real = kit_tools / name if name in TOOLS else Path("/usr/bin") / name
        if not real.exists() and name not in TOOLS:
            real = Path("/bin") / name
        path = directory / name
        path.write_text(
            f'#!/bin/sh\necho "$(/usr/bin/id -un) {name}" >> {shlex.quote(str(marker))}'
            f'\nexec {shlex.quote(str(real))} "$@"\n'
        )
        path.chmod(0o755)
    _checked("chown", "-R", f"{owner}:{owner}", str(directory))


def marked(marker: Path) -> list[tuple[str, str]]:
    """(account, tool) for every run of a planted tool, in order."""
    return [
        (w[0], w[1])
        for w in (line.split() for line in marker.read_text().splitlines())
        if len(w) == 2
    ]


@contextmanager
def sudoers_installed(text: str) -> Iterator[Path]:
    """``text`` live in /etc/sudoers.d (a unique name without "."), after ``visudo -cf``
    accepted it; removed after."""
    with drop_ins_installed([text]) as [path]:
        yield path


@contextmanager
def drop_ins_installed(texts: list[str]) -> Iterator[list[Path]]:
    """Each of ``texts`` live in /etc/sudoers.d at once, in that order (sudo reads the
    directory sorted by name), each accepted by ``visudo -cf`` first; removed after."""
    tag = secrets.token_hex(4)
    paths = [SUDOERS_D / f"vllm_chatops_test_{tag}_{i}" for i in range(len(texts))]
    # One test's drop-ins at a time across xdist workers: a test's drop-in may define
    # alias names another test's defines too (two tests with a login of the same name,
    # a test that defines a duplicate on purpose), and sudo would then bind one test's
    # rules to the other's commands.
    lock = open(SUDOERS_LOCK, "a")  # held for the drop-in's whole life
    fcntl.flock(lock, fcntl.LOCK_EX)
    # With the lock held, any other test drop-in is a dead run's (a run killed inside this
    # block, as a CI timeout does, leaves its file; the kernel drops its lock). Left
    # there it redefines the same aliases, and sudo keeps whichever file sorts first: a
    # later run then failed about half its sudo tests, by the random names' order.
    for stale in [
        *SUDOERS_D.glob("vllm_chatops_test_*"),
        *SUDOERS_D.glob(".vllm_chatops_test_*.new"),
    ]:
        stale.unlink(missing_ok=True)
    # Written beside it under a name sudo skips (it has a "."), then renamed: a test running
    # sudo meanwhile never reads half a file (a copy from /tmp, on another file system,
    # would be written in place, and sudo refuses every command while a drop-in is broken).
    stagings = [path.with_name(f".{path.name}.new") for path in paths]
    try:
        for text, staging in zip(texts, stagings, strict=True):
            fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o440)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            check = _run("visudo", "-c", "-f", str(staging))
            assert check.returncode == 0, f"visudo refused the rules:\n{check.stdout}{check.stderr}"
        for staging, path in zip(stagings, paths, strict=True):
            os.rename(staging, path)
        yield paths
    finally:
        for staging, path in zip(stagings, paths, strict=True):
            staging.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
        lock.close()  # releases the lock


@contextmanager
def workspace() -> Iterator[Path]:
    """A directory every account can traverse (pytest's tmp_path is root's only)."""
    base = Path(tempfile.mkdtemp(prefix="chatops-nonroot-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)
