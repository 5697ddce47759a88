"""The exact remote argv the engine runs, built only from configuration and validated values.

Nothing a user typed reaches these functions except a service name that was
looked up in the config, a version that parsed as PEP 440, and an index name
that was looked up in the config; the SSH layer then quotes every element.
"""

from __future__ import annotations

import re
import shlex
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from bot.core.cuda import GATE_CODE
from bot.core.gpu import APPS_QUERY_ARGV, GPU_QUERY_ARGV
from bot.core.packages import parse_entry
from bot.core.privilege import SAFE_PRELUDE, SH, Command, Privilege, run_as_of
from bot.core.unit_flags import HELP_BEGIN, HELP_END, HELP_FAILED
from bot.settings import ServiceSettings

Argv = tuple[str, ...]

# systemctl show prints these as KEY=value lines, in its own order.
UNIT_PROPERTIES = "LoadState,ActiveState,SubState,MainPID"
# Anchored so the shell and `timeout` wrapping our own pgrep never match themselves.
WORKER_PATTERN = "^VLLM::"


def package_spec(svc: ServiceSettings, version: str | None) -> str:
    return svc.package if version is None else f"{svc.package}=={version}"


# "--" ends systemctl's options (getopt): a unit name is then never read as one, even
# if the settings' check that no name starts with "-" were ever bypassed.  Without it,
# systemd 252 reads `systemctl stop --now.service` as "unrecognized option".
# Every command on the unit runs as root (``bot.core.privilege``): under `become = "sudo"`
# the sudoers rules name each of these lines exactly.
# --no-pager on every systemctl and journalctl: systemd before 247 ran its pager (less,
# which can run a shell) as root under sudo when a terminal was attached (CVE-2023-26604);
# the bot never asks for a terminal, and the rules then name no line that could page.
def unit_show(svc: ServiceSettings) -> Argv:
    return Command(
        (svc.systemctl, "show", "-p", UNIT_PROPERTIES, "--no-pager", "--", svc.unit), Privilege.ROOT
    )


def unit_exec_start(svc: ServiceSettings) -> Argv:
    """The unit's command line and the environment systemd expands its ``$VAR`` words
    with (its flags are checked against the new vLLM). No privilege: any account may read
    a unit's properties, and a separate read leaves the sudo rule of ``unit_show`` as
    hosts already have it."""
    return Command(
        (
            svc.systemctl,
            "show",
            *("-p", "ExecStart", "-p", "Environment", "-p", "EnvironmentFiles"),
            "--no-pager",
            "--",
            svc.unit,
        )
    )


def env_file_read(path: str) -> Argv:
    """One of the unit's EnvironmentFiles (a path ``systemctl show`` gave), read as the
    login: systemd reads them as root, so one may be root's alone, and then its words are
    said as not checked. No sudo rule: the path comes from the host, not the config, and a
    rule that let the bot read root's files could read any of them (tokens and keys
    among them)."""
    return ("cat", "--", path)


def unit_is_active(svc: ServiceSettings) -> Argv:
    return Command((svc.systemctl, "is-active", "--no-pager", "--", svc.unit), Privilege.ROOT)


def unit_stop(svc: ServiceSettings) -> Argv:
    return Command((svc.systemctl, "stop", "--no-pager", "--", svc.unit), Privilege.ROOT)


def unit_start(svc: ServiceSettings) -> Argv:
    return Command((svc.systemctl, "start", "--no-pager", "--", svc.unit), Privilege.ROOT)


def journal_tail(svc: ServiceSettings, lines: int | None = None) -> Argv:
    # No "--": the unit is not an operand but the value of -u, which getopt takes
    # whatever it starts with (`journalctl -u --foo` looks for unit "--foo"); operands
    # after "--" would be journal matches.
    n = svc.journal_lines if lines is None else lines
    return Command((svc.journalctl, "-u", svc.unit, "-n", str(n), "--no-pager"), Privilege.ROOT)


# Following a start: entries as their message only (``-o cat``), each poll only those
# after the cursor the previous one printed (``--show-cursor``), and never more than
# ``journal_follow_lines`` of them, however much the server logs.
def journal_cursor(svc: ServiceSettings) -> Argv:
    """The unit's latest entry and its cursor: where following a start begins."""
    return Command(
        (
            svc.journalctl,
            "-u",
            svc.unit,
            "-n",
            "1",
            "--show-cursor",
            "-o",
            "cat",
            "-q",
            "--no-pager",
        ),
        Privilege.ROOT,
    )


def journal_follow(svc: ServiceSettings, cursor: str | None) -> Argv:
    """The unit's entries after ``cursor`` (all of them, within the bound, without one:
    the unit had none before the start)."""
    after = (f"--after-cursor={cursor}",) if cursor else ()
    return Command(
        (
            svc.journalctl,
            "-u",
            svc.unit,
            *after,
            "-n",
            str(svc.journal_follow_lines),
            "--show-cursor",
            "-o",
            "cat",
            "-q",
            "--no-pager",
        ),
        Privilege.ROOT,
    )


def package_show(svc: ServiceSettings) -> Argv:
    # As the venv's owner, like everything that reads the venv through its interpreter
    # (``as_owner``): uv runs the interpreter to learn about it.
    return as_owner(svc.uv, "pip", "show", "--python", svc.python, _bare_name(svc.package))


def free_disk(svc: ServiceSettings) -> Argv:
    return ("df", "-P", "-B1M", svc.venv_dir)


# An index URL may carry credentials (https://user:token@host/simple, or a token in its
# path or query), and every user of a GPU host can read any process's argv (`ps`).  So
# the URL never goes into an argv: uv reads --extra-index-url from this variable too
# (`uv pip install --help`: "[env: UV_EXTRA_INDEX_URL]", uv 0.9 and 0.13), and a fixed
# script reads it from stdin, exports it and execs uv, whose argv then shows no index.
# No text from a user or the config is part of the script (uv's argv follows as "$@");
# the environment of a process is readable only by its owner (/proc/PID/environ, 0400).
# It applies to every install with an index, not only URLs that look like they hold a
# secret: which part of a URL is secret cannot be told from the URL.
INDEX_ENV = "UV_EXTRA_INDEX_URL"
INDEX_FROM_STDIN: Argv = (
    "sh",
    "-c",
    f'IFS= read -r {INDEX_ENV} && export {INDEX_ENV} && exec "$@"',
    "sh",
)


def with_index(argv: Argv, index_url: str | None) -> Argv:
    # The wrapper itself needs no rights: the command it execs keeps its own.
    return argv if index_url is None else Command((*INDEX_FROM_STDIN, *argv), run_as_of(argv))


def index_input(index_url: str | None) -> bytes | None:
    """What an install built with ``index_url`` reads on its stdin (None: nothing)."""
    return None if index_url is None else f"{index_url}\n".encode()


def shown(argv: Argv) -> str:
    """What an operator would type: the argv, quoted.  An install reading its index from
    stdin shows as ``UV_EXTRA_INDEX_URL=<index URL, on stdin> uv pip install ...``, so
    neither the card nor the audit log holds the URL."""
    n = len(INDEX_FROM_STDIN)
    if argv[:n] == INDEX_FROM_STDIN:
        return f"{INDEX_ENV}=<index URL, on stdin> {shlex.join(argv[n:])}"
    return shlex.join(argv)


def index_host(index_url: str) -> str:
    """Where an index is, for the card and the terminal: its host only.  The rest of the
    URL (user, password, path, query) may hold a token, and Slack keeps what it is sent."""
    try:
        return urlsplit(index_url).hostname or "?"
    except ValueError:
        return "?"


def as_owner(*argv: str) -> Command:
    """What writes the venv runs as its owner (``venv_user``).  The dry run too: uv
    locks the venv, and it fills the cache the install then reads.  And so does what
    runs the venv's interpreter (uv runs it to learn about it; the import gate): a
    ``.pth`` file in its site-packages runs whenever it starts, and whoever writes the
    venv (its owner, so a compromised model server) can put one there.  Run as the
    login, that code would hold the login's sudo rules (issue 17, F2)."""
    return Command(argv, Privilege.VENV_OWNER)


def install_dry_run(svc: ServiceSettings, spec: str, index_url: str | None) -> Argv:
    return with_index(
        as_owner(
            svc.uv, "pip", "install", "--python", svc.python, "--dry-run", "--force-reinstall", spec
        ),
        index_url,
    )


def install(svc: ServiceSettings, spec: str, index_url: str | None) -> Argv:
    return with_index(
        as_owner(svc.uv, "pip", "install", "--python", svc.python, "--force-reinstall", spec),
        index_url,
    )


def install_previous(svc: ServiceSettings, version: str, index_url: str | None) -> Argv:
    # Only the one package is reinstalled: the rollback should touch as little as possible.
    name = _bare_name(svc.package)
    return with_index(
        as_owner(
            svc.uv,
            "pip",
            "install",
            "--python",
            svc.python,
            "--reinstall-package",
            name,
            f"{name}=={version}",
        ),
        index_url,
    )


# ---- the whole environment: snapshot, prefetch, gate, rollback (issue 10) ---------------


def freeze(svc: ServiceSettings) -> Argv:
    """The venv's every package, pinned, on stdout (its ``Using Python`` line on stderr)."""
    return as_owner(svc.uv, "pip", "freeze", "--python", svc.python)


def state_dir(svc: ServiceSettings) -> str:
    """Where the bot keeps its files on the host: next to the venv, on its file system
    (``/opt/venvs/vllm`` -> ``/opt/venvs/.chatops``)."""
    return str(PurePosixPath(svc.venv_dir).parent / ".chatops")


def _venv_name(svc: ServiceSettings) -> str:
    return PurePosixPath(svc.venv_dir).name or "venv"


def lock_path(svc: ServiceSettings, digest: str) -> str:
    """The snapshot's file on the host, named by the SHA-256 of its text: a rollback
    syncs to exactly it, and the same environment always gets the same name."""
    return f"{state_dir(svc)}/{_venv_name(svc)}-{digest[:16]}.freeze.txt"


# The scripts that write beside the venv may run as root (user = "root", become =
# "none") in a directory another account can write (the README makes .chatops the venv
# owner's for sudo hosts), and a name anyone can guess there ("$2.tmp.$$") can be a link
# planted in advance: root would write through it wherever it points (issue 17, F8). So
# they write only into a directory ("$dir") that their own account (or root) owns and no
# other account can write, every directory above it owned by root or that account and
# not writable by all (a sticky /tmp is fine): then nobody else can plant anything there.
OWN_DIR = (
    'me=$(id -u); d=$(readlink -f -- "$dir") || exit 1; top=$d; '
    'while :; do s=$(stat -c "%u %a" -- "$d") || exit 1; set -- $s; '
    'case $1 in 0|"$me") ;; *) echo "$d is owned by uid $1, not by $(id -un) who writes '
    'in it: nothing written" >&2; exit 1;; esac; '
    'if [ "$d" = "$top" ]; then case $2 in *[2367]?|*[2367]) echo "$d can be written by '
    'other accounts (mode $2): nothing written" >&2; exit 1;; esac; '
    'else case $2 in [1357]???) ;; *[2367]) echo "$d can be written by every account '
    '(mode $2): nothing written" >&2; exit 1;; esac; fi; '
    '[ "$d" = / ] && break; d=${d%/*}; d=${d:-/}; done; '
)

# Writes stdin to "$2" (in directory "$1"), atomically, readable by its owner only (a
# freeze may hold a URL with a token): a fixed script, the paths come as arguments.
# Through a new file mktemp makes (O_EXCL: never an existing name or link), moved over
# "$2" by rename(2), which replaces a link there and never follows it (-T: never into a
# directory planted at "$2").
SAVE_FROM_STDIN = (
    SAFE_PRELUDE
    + 'umask 077; set -f; dir=$1; out=$2; mkdir -p -- "$dir" || exit 1; '
    + OWN_DIR
    + 't=$(mktemp -- "$out.tmp.XXXXXXXXXX") || exit 1; '
    'if cat >> "$t" && mv -f -T -- "$t" "$out"; then exit 0; fi; rm -f -- "$t"; exit 1'
)


def save_lock(svc: ServiceSettings, path: str) -> Argv:
    """Keep the snapshot (given on stdin) at ``path``."""
    return as_owner(SH, "-c", SAVE_FROM_STDIN, "sh", state_dir(svc), path)


def prefetch_dir(svc: ServiceSettings) -> str:
    return f"{state_dir(svc)}/prefetch-{_venv_name(svc)}"


def serve_help(venv: str) -> str:
    """The script's part that lists the new ``vllm serve``'s options when ``$hm`` is
    ``serve`` (the unit starts ``vllm serve``): ``--help=all`` lists every option on the
    grouped help (vLLM 0.11 on), whose plain ``--help`` lists only the groups; before it,
    argparse refuses ``--help=all`` or (0.10) takes it as a search for "all", and
    ``--help`` lists them all. Each bounded by ``$gt`` (gate_timeout_s). The help goes to
    a file in ``venv`` and only its option lines, two spaces in, reach the output (written
    " {2}": sudoers reads a run of spaces in a rule as one)."""
    return (
        f'if [ "$hm" = serve ]; then h="{venv}/serve-help"; '
        f"echo {HELP_BEGIN}; "
        f'if timeout -k 10 "$gt" "{venv}/bin/vllm" serve --help=all >"$h" 2>&1 '
        # vLLM 0.10 exits 0 on --help=all with the options whose name holds "all", none
        # indented: its plain --help lists them all.
        "&& grep -q -E '^ {2}--port( |$)' \"$h\" "
        f'|| timeout -k 10 "$gt" "{venv}/bin/vllm" serve --help >"$h" 2>&1; '
        "then grep -E '^ {2}--?[[:alpha:]]' \"$h\" || true; "
        f'rm -f -- "$h"; echo {HELP_END}; '
        f'else e=$?; echo "{HELP_FAILED} exit $e: $(tail -n 2 "$h" | paste -s -d " " -)"; '
        'rm -f -- "$h"; fi; fi'
    )


# Installs the pinned set read on stdin into a throwaway venv, then removes it: every
# wheel the install will need is then in uv's cache, so the install during the outage
# downloads nothing. --no-deps: the set is complete and pinned, nothing to resolve. The
# venv's name carries the shell's PID, so two prefetches never share one; a signal
# (the step's timeout) still removes it. Its directory is checked as the snapshot's
# (``OWN_DIR``), so no other account can have put anything at that name.
PREFETCHED_MARK = "chatops-prefetched"
PREFETCH_SCRIPT = (
    # uv's path as the bot runs it everywhere else: absolute on a sudo host (the rules name
    # it), else as the login's own PATH finds it (become = "none": that account's own);
    # found before PATH is fixed, and nothing after is found through the caller's PATH.
    'uv=$(command -v -- "$2") || { echo "$2: not found" >&2; exit 127; }; '
    + SAFE_PRELUDE
    + 'set -f; t="$1.$$"; py=$3; gt=$4; gc=$5; hm=$6; dir=${1%/*}; '
    '(umask 077; mkdir -p -- "$dir") || exit 1; ' + OWN_DIR + "set -e; "
    "trap 'rm -rf -- \"$t\"' EXIT; trap 'exit 143' HUP INT TERM; "
    '"$uv" venv --quiet --python "$py" "$t"; '
    '"$uv" pip install --python "$t/bin/python" --no-deps -r /dev/stdin; '
    # The throwaway venv is the new environment: its own interpreter runs the import
    # gate (GATE_CODE, "$5") before the venv is removed, bounded by gate_timeout_s ("$4");
    # both kept (and "$6", below) before OWN_DIR's `set --` replaces the positional
    # parameters.
    # The mark on stdout says the install itself succeeded, so a failure after it is the
    # gate's (issue 20).
    f"echo {PREFETCHED_MARK}; "
    'timeout -k 10 "$gt" "$t/bin/python" -c "$gc"; ' + serve_help("$t")
)


def prefetch(svc: ServiceSettings, index_url: str | None, *, check_flags: bool = False) -> Argv:
    """Fetch the pinned set (on stdin, after the index URL when there is one); with
    ``check_flags``, also list the new ``vllm serve``'s options."""
    return with_index(
        as_owner(
            SH,
            "-c",
            PREFETCH_SCRIPT,
            "sh",
            prefetch_dir(svc),
            svc.uv,
            svc.python,
            f"{svc.gate_timeout_s:g}",
            GATE_CODE,
            "serve" if check_flags else "none",
        ),
        index_url,
    )


def prefetch_shown(svc: ServiceSettings, index_url: str | None) -> str:
    """The prefetch as an operator would type it (the plan and the card)."""
    t = prefetch_dir(svc)
    index = f"{INDEX_ENV}=<index URL, on stdin> " if index_url else ""
    return (
        f"{shlex.join((svc.uv, 'venv', '--python', svc.python, t))} && {index}"
        f"{shlex.join((svc.uv, 'pip', 'install', '--python', t + '/bin/python'))} "
        f"--no-deps -r <the dry run's pinned set> && "
        f"{shlex.quote(t + '/bin/python')} -c 'import vllm, torch' (the import and CUDA gate, "
        f"before the stop) && {shlex.quote(t + '/bin/vllm')} serve --help=all (the unit's "
        f"flags, when it starts `vllm serve`); rm -rf {shlex.quote(t)}"
    )


def sync_lock(
    svc: ServiceSettings, path: str, *, offline: bool, index_url: str | None = None
) -> Argv:
    """Make the venv exactly the snapshot: every package at its version, new ones removed.
    ``offline``: from uv's cache only (a build the index no longer serves can still come
    back); else from the index too."""
    argv = as_owner(
        svc.uv, "pip", "sync", "--python", svc.python, *(("--offline",) if offline else ()), path
    )
    return argv if offline else with_index(argv, index_url)


def import_gate(svc: ServiceSettings) -> Argv:
    return as_owner(svc.python, "-c", GATE_CODE)


def driver_info() -> Argv:
    """Plain ``nvidia-smi``: its header names the CUDA version the driver supports."""
    return ("nvidia-smi",)


def gpu_query() -> Argv:
    return GPU_QUERY_ARGV


def apps_query() -> Argv:
    return APPS_QUERY_ARGV


def workers_query() -> Argv:
    return ("pgrep", "-a", "-f", WORKER_PATTERN)


def installs_query(svc: ServiceSettings) -> Argv:
    """Any ``uv pip install`` (or a rollback's ``uv pip sync``) into the service's venv
    still running, e.g. one that outlived the SSH connection that started it.  Built
    from config values only; anchored, so neither this pgrep nor the shell and
    ``timeout`` around a command can match (their command lines start with another
    word)."""
    pattern = f"^{_ere_escape(svc.uv)} pip (install|sync) --python {_ere_escape(svc.python)}( |$)"
    return ("pgrep", "-a", "-f", pattern)


# Special in POSIX extended regular expressions (pgrep's) and in Python's re alike.
_ERE_SPECIAL = frozenset(".[]()*+?{}|^$\\")


def _ere_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in _ERE_SPECIAL else c for c in text)


def _bare_name(package: str) -> str:
    return package.split("[", 1)[0]


def parse_unit_show(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_package_version(text: str) -> str | None:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "Version":
            return value.strip() or None
    return None


def _normal_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_resolved_version(text: str, package: str) -> str | None:
    """The version of ``package`` an install (or its dry run) installs, from uv's
    `` + name==version`` lines (`` + name==version (from URL)`` for a direct URL or a
    local wheel, `` + name @ URL`` with the version in the wheel's file name); None when
    uv did not say."""
    want = _normal_name(_bare_name(package))
    for line in text.splitlines():
        line = line.strip()
        entry = parse_entry(line[2:]) if line.startswith("+ ") else None
        if entry is not None and entry.name == want and entry.version:
            return entry.version
    return None


# One data line of ``df -P``: ``fs blocks used avail capacity mount``.  Either end may
# contain spaces (a tmpfs mounted from "my fs" on "/srv/a b"), so neither splitting
# from the left nor from the right is safe.  The four number columns followed by a
# path are what anchors the line: the lazy filesystem name stops at the first place
# they match, which is the real one unless the name itself holds such a sequence.
_DF_LINE = re.compile(
    r"(?P<fs>.+?)[ \t]+(?P<blocks>[0-9]+)[ \t]+(?P<used>[0-9]+)[ \t]+(?P<avail>[0-9]+)"
    r"[ \t]+(?:[0-9]+%|-)[ \t]+(?P<mount>/.*)"
)


def parse_df_avail_mib(text: str) -> int | None:
    """The Available column of ``df -P -B1M PATH``: a header line, then one line
    ``fs blocks used avail capacity mount`` (POSIX format; ``-P`` never wraps a long
    filesystem name onto a line of its own).  None when no line has that shape."""
    for line in text.splitlines()[1:]:
        match = _DF_LINE.fullmatch(line.strip())
        if match is not None:
            return int(match["avail"])
    return None
