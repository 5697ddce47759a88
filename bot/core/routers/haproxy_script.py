"""The fixed script the bot speaks to HAProxy's admin socket through, as root where the
router's host uses sudo (``python -m bot sudoers`` prints its rules).

socat to the admin socket as root used to be the rule: whoever held the bot's key could
then send the socket any Runtime API command, on any backend (re-point another team's
backend, ``disable frontend``, ``expert-mode on`` and dump memory, ``shutdown
sessions``, kill HAProxy). The script takes the Runtime API command as its arguments and
sends only ``show stat`` and ``set server <backend>/<server> state ready|drain|maint``,
for the backend fixed before them in its argv (and so in each sudoers rule). Each rule
is exact: one for ``show stat``, and one per configured server and state. So sudo lets
the key run nothing else, and the script refuses anything else again itself (for a host
with ``become = "none"``, and whatever a rule might one day allow).

The style of the leftover-kill script (``bot.core.leftovers``): ``/bin/sh -c <script>``,
the script's text part of the rule, so installing the drop-in installs the script; its
tools by the absolute paths the rule fixes (socat), PATH fixed first; single spaces and
no backslash in its text (sudoers collapses runs of unescaped spaces, and a rule's
``\\\\`` does not match a backslash). Its checks are ``case`` patterns, which match a
whole word: a name is refused when any character is outside HAProxy's own set for names
(letters, digits, ``. _ : -``), a newline, ``;``, a space or ``/`` included, the
character classes read bytes in the C locale.

What it prints is socat's, HAProxy's reply, so ``bot.core.routers.haproxy``'s parsers
read it as before; a refusal is one line on stderr starting ``refused:`` and exit 2,
before anything reaches the socket.
"""

from __future__ import annotations

from bot.core.privilege import SAFE_PRELUDE, SH, Command, Privilege
from bot.core.routers.haproxy import State
from bot.settings import HAPROXY_NAME_RE

# Exit status of a refusal (socat's own failures exit 1).
REFUSED_EXIT = 2
REFUSED_PREFIX = "refused:"

# HAPROXY_NAME_RE as the script checks it: its first character, the rest, its length.
# tests/test_haproxy_script.py runs the script on random names against the regex.
_FIRST = "[A-Za-z0-9]"
_REST = "A-Za-z0-9._:-"
_MAX_LEN = 63
# The settings' pattern is this one: a change to either must change both.
assert HAPROXY_NAME_RE.pattern == f"{_FIRST}[{_REST}]{{0,{_MAX_LEN - 1}}}", HAPROXY_NAME_RE

RUNTIME_SCRIPT = (
    SAFE_PRELUDE
    # The C locale: the character classes below then mean those bytes exactly.
    + "LC_ALL=C; export LC_ALL; set -f; "
    + 'no() { echo "refused: $*" >&2; exit 2; }; '
    + f"name() {{ case $1 in {_FIRST}*) ;; *) return 1;; esac; "
    + f"case $1 in *[!{_REST}]*) return 1;; esac; [ ${{#1}} -le {_MAX_LEN} ]; }}; "
    + "[ $# -ge 3 ] || no 'usage: <socat> <socket> <backend> <command>'; "
    + "socat=$1; socket=$2; backend=$3; shift 3; "
    + 'case $socat in /*) ;; *) no "socat must be an absolute path: $socat";; esac; '
    + 'case $socket in /*) ;; *) no "not an absolute socket path: $socket";; esac; '
    + 'case $socket in *[!A-Za-z0-9._+/@-]*) no "not a plain socket path: $socket";; esac; '
    + 'name "$backend" || no "not a backend name: $backend"; '
    + 'if [ $# -eq 2 ] && [ "$1" = show ] && [ "$2" = stat ]; then cmd=\'show stat\'; '
    + 'elif [ $# -eq 5 ] && [ "$1" = set ] && [ "$2" = server ] && [ "$4" = state ]; '
    + 'then case $3 in "$backend"/*) ;; *) no "not a server of backend $backend: $3";; '
    + 'esac; server=${3#"$backend"/}; '
    + 'name "$server" || no "not a server name: $server"; '
    + 'case $5 in ready|drain|maint) ;; *) no "not a state this script sets: $5";; esac; '
    + 'cmd="set server $backend/$server state $5"; '
    + "else no 'only show stat and set server <backend>/<server> state ready|drain|maint'; "
    + "fi; "
    # -t 5: wait up to 5 s for HAProxy's reply after the command (socat's default 0.5 s
    # a loaded HAProxy can miss). The socket path is a plain one (no `,` or `:`, which
    # socat's address syntax would read as options).
    + 'echo "$cmd" | "$socat" -t 5 stdio "unix-connect:$socket"'
)
assert "  " not in RUNTIME_SCRIPT and "\\" not in RUNTIME_SCRIPT  # see the module doc

Words = tuple[str, ...]
SHOW_STAT: Words = ("show", "stat")
STATES: tuple[State, ...] = ("drain", "maint", "ready")


def set_state_words(backend: str, server: str, state: State) -> Words:
    return ("set", "server", f"{backend}/{server}", "state", state)


def runtime_command(socat: str, socket: str, backend: str, words: Words) -> Command:
    """The script sending ``words`` (``SHOW_STAT`` or ``set_state_words``) for
    ``backend`` through ``socat`` to ``socket``, as root: the socket is HAProxy's (mode
    660, group haproxy on Debian). The whole argv is what a sudoers rule names."""
    return Command((SH, "-c", RUNTIME_SCRIPT, "sh", socat, socket, backend, *words), Privilege.ROOT)


def words_of(argv: tuple[str, ...]) -> Words | None:
    """The Runtime API command of an argv ``runtime_command`` built, else None."""
    if argv[:4] != (SH, "-c", RUNTIME_SCRIPT, "sh") or len(argv) < 7:
        return None
    return tuple(argv[7:])


def refusal(stderr: str) -> str | None:
    """The script's own refusal in ``stderr``, or None."""
    return next(
        (line.strip() for line in stderr.splitlines() if line.startswith(REFUSED_PREFIX)),
        None,
    )
