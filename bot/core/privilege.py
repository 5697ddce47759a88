"""Which account a remote command needs, and what sudo says when it refuses.

Every argv builder in ``bot.core.remote`` states the account its command needs by
returning a ``Command`` (an argv tuple that carries ``run_as``); a plain tuple needs
none.  ``bot.core.become.become`` is the one place that turns that into a ``sudo``
prefix for a host whose settings say ``become = "sudo"``; nothing else in the bot
knows about sudo.  So a new remote command gets the right rights by saying, where it
is built, which account it needs:

- ``NONE``: read-only queries (``nvidia-smi``, ``pgrep``, ``df``, ``ps``).
- ``ROOT``: the service's own unit (``systemctl stop|start|is-active|show <unit>``,
  ``journalctl -u <unit>``), and signalling processes the unit left behind.
- ``VENV_OWNER``: what writes the venv (``uv pip install``/``sync``), and what runs or
  reads its code (``uv pip freeze``/``show``, the import gate: a ``.pth`` file there runs
  whenever its interpreter starts), as the service's ``venv_user``; the login user
  itself when none is configured.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from enum import StrEnum

# The shell every fixed script runs under, by its absolute path: sudo finds a bare `sh`
# in the caller's PATH when the host's sudoers has no `secure_path` (sudo 1.9.13p3, tried
# with a login whose PATH holds its own `sh`: found, then refused as no rule's /bin/sh).
SH = "/bin/sh"
# The PATH a script that runs with rights sets before anything else, and the
# `secure_path` the sudoers drop-in gives the bot's rules: directories only root can
# write on Debian, Ubuntu and RHEL. Upstream sudo keeps the caller's PATH when
# `secure_path` is not set (`Defaults !secure_path`), so without this a command a script
# ran by name would be the first one the login account put in its own PATH (issue 17, F1).
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# The first words of such a script: that PATH, and none of the variables a shell would
# read on its own (IFS splits words, ENV and BASH_ENV name files an interactive or bash
# shell runs, CDPATH moves `cd`).
SAFE_PRELUDE = f"PATH={SAFE_PATH}; export PATH; unset IFS ENV BASH_ENV CDPATH; "


class Privilege(StrEnum):
    NONE = "none"
    ROOT = "root"
    VENV_OWNER = "venv_owner"


class Command(tuple[str, ...]):
    """An argv (a tuple of strings, equal to the plain tuple) that says which account it
    needs.  Slicing or joining gives plain tuples and strings, as for any tuple."""

    run_as: Privilege

    def __new__(cls, argv: Iterable[str], run_as: Privilege = Privilege.NONE) -> Command:
        self = super().__new__(cls, argv)
        self.run_as = run_as
        return self


def run_as_of(argv: Sequence[str]) -> Privilege:
    """The account ``argv`` needs: its ``Command.run_as``; NONE for a plain tuple."""
    return argv.run_as if isinstance(argv, Command) else Privilege.NONE


def sudo_question(argv: Sequence[str], account: str | None = None) -> tuple[str, ...]:
    """``sudo -n -l [-u account] -- argv``: whether sudo would let the login run ``argv``
    (as ``account``; root when None), asked without running it. sudo prints the command
    and exits 0 where a rule allows it, and exits 1 where none does (silently, or "a
    password is required" for a login with no NOPASSWD rule); -n: it never prompts. What
    ``doctor`` and a host run's preflight ask, so both ask the same question."""
    who = ("-u", account) if account else ()
    return ("sudo", "-n", "-l", *who, "--", *argv)


# ---- sudo's own words when it refuses ---------------------------------------------------
# Captured from Debian 12's sudo 1.9.13p3 (bookworm), run as `sudo -n ...` by a user
# with and without a matching rule (tests/test_sudoers.py holds the captures).  sudo
# exits 1 in every case, as the command itself may, so only these lines tell them apart.

_ASKS_PASSWORD = "sudo: a password is required"  # noqa: S105 (sudo's message)
_TERMINAL = "sudo: a terminal is required to read the password"
_TTY = "sudo: sorry, you must have a tty to run sudo"
_NOT_ALLOWED = re.compile(
    r"Sorry, user (?P<user>\S+) is not allowed to execute '(?P<cmd>.*)' as (?P<runas>\S+) "
    r"on (?P<host>.+)\."
)
_NOT_IN_SUDOERS = re.compile(r"(?P<user>\S+) is not in the sudoers file\b.*")
_UNKNOWN_USER = re.compile(r"sudo: unknown user:? (?P<user>\S+)")
_NOT_FOUND = re.compile(r"sudo: (?P<cmd>\S+): command not found")
# /bin/sh (dash) when the host has no sudo at all: "sh: 1: sudo: not found".
_NO_SUDO = re.compile(r"(?:\S+: )?(?:\d+: )?sudo: (?:not found|command not found)")


def sudo_refusal(exit_status: int | None, stderr: str) -> str | None:
    """Why sudo did not run the command, in a few words, or None when sudo ran it (its
    exit status is then the command's).  Only exit 1 (sudo's refusal) and 127 (no sudo
    on the host) can be a refusal."""
    if exit_status not in (1, 127):
        return None
    for raw in stderr.splitlines():
        line = raw.strip()
        if exit_status == 127:
            if _NO_SUDO.fullmatch(line):
                return "sudo is not installed on the host"
            continue
        if line == _ASKS_PASSWORD or line.startswith(_TERMINAL):
            return "sudo asked for a password: no NOPASSWD rule matches this exact command line"
        if line == _TTY:
            return "sudo requires a tty (requiretty): add `Defaults:<user> !requiretty`"
        if m := _NOT_ALLOWED.fullmatch(line):
            return f"sudo does not allow {m['user']} to run this command line as {m['runas']}"
        if m := _NOT_IN_SUDOERS.fullmatch(line):
            return f"{m['user']} has no sudo rules on this host"
        if m := _UNKNOWN_USER.fullmatch(line):
            return f"the account {m['user']} does not exist on this host"
        if m := _NOT_FOUND.fullmatch(line):
            return f"{m['cmd']} does not exist on this host"
    return None
