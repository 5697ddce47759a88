"""``doctor``'s authorized_keys check: whether the login can change its own key's
restrictions (issue 17, F2)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable
from dataclasses import dataclass

from bot.core.doctor_types import Answer, Argv, Check, Outcome, Probe, judged
from bot.core.privilege import SH, Privilege
from bot.core.results import CommandResult
from bot.settings import Settings

# ---- whether the login can change its own key's restrictions (issue 17, F2) ----------
# The key entry's restrict, from= and permitopen= bound what the bot's key can do; an
# account that can write the file sshd reads them from can add a key without them. So
# that file should be root's (README: AuthorizedKeysFile /etc/ssh/authorized_keys/%u).
# Read as the login itself, changing nothing: who it is, and sshd's configuration with
# its Include files in place (sshd takes the first AuthorizedKeysFile it reads; a `Match
# User` block for the login overrides it; one under a Match that depends on more than
# the user may apply, so it is checked as well); then, for each file named, the first of
# it and the directories above it the login owns or can write.
SSHD_KEYS_SCRIPT = (
    'printf "%s %s %s\\n" "$(id -un)" "$(id -u)" "$HOME"; base=${1%/*}; '
    # `local` (dash and bash): each level of Include keeps its own file and line.
    'dump() { local file=$1 depth=$2 l g f; [ "$depth" -gt 16 ] && return; '
    'if [ ! -r "$file" ]; then echo "#chatops-unreadable $file"; return; fi; '
    'while IFS= read -r l || [ -n "$l" ]; do printf "%s\\n" "$l"; set -f; set -- $l; set +f; '
    "case $1 in [Ii][Nn][Cc][Ll][Uu][Dd][Ee]) shift; for g do "
    'case $g in /*) ;; *) g=$base/$g;; esac; for f in $g; do [ -e "$f" ] && '
    'dump "$f" $((depth + 1)); done; done;; esac; done < "$file"; }; dump "$1" 0'
)
KEY_FILE_SCRIPT = (
    "for f do p=$f; v=locked; child=; while :; do "
    'if [ -e "$p" ] || [ -L "$p" ]; then '
    'if [ -O "$p" ]; then v="owned $p"; break; fi; '
    # A sticky directory (/tmp) lets it add a name there, not replace another's.
    'if [ -w "$p" ] && ! { [ -d "$p" ] && [ -k "$p" ] && [ -n "$child" ] && '
    '{ [ -e "$child" ] || [ -L "$child" ]; }; }; then '
    'v="writable $p"; break; fi; fi; '
    '[ "$p" = / ] && break; child=$p; p=${p%/*}; p=${p:-/}; done; '
    'printf "%s\\t%s\\n" "$f" "$v"; done'
)
_DEFAULT_KEY_FILES = ".ssh/authorized_keys .ssh/authorized_keys2"


@dataclass(frozen=True, slots=True)
class KeyFiles:
    """The files sshd may read the login's keys from; ``unknown``: why they cannot be told."""

    user: str
    files: tuple[str, ...] = ()
    unknown: str | None = None


def _keyword(line: str) -> tuple[str, str]:
    m = re.match(r"\s*([A-Za-z]+)(?:\s*=\s*|\s+)(.*)", line)
    return (m[1].lower(), m[2].strip()) if m else ("", "")


def key_files(text: str) -> KeyFiles:
    """What ``SSHD_KEYS_SCRIPT`` printed, as the files sshd reads the login's keys from."""
    lines = text.splitlines()
    ident = lines[0].split(" ", 2) if lines else []
    if len(ident) != 3 or not ident[2].startswith("/"):
        return KeyFiles("", unknown="the login's name and home were not read")
    user, uid, home = ident
    first: str | None = None  # the global section's
    matched: str | None = None  # the first Match block that applies to the login
    maybe: list[str] = []  # Match blocks that may apply: checked too
    block: bool | None = True  # the section we are in applies (None: may)
    in_match = False
    for raw in lines[1:]:
        if raw.startswith("#chatops-unreadable "):
            return KeyFiles(user, unknown=f"{user} cannot read {raw.split(' ', 1)[1]}")
        key, value = _keyword(raw)
        if key == "match":
            in_match, block = True, _match_applies(value, user)
        elif key != "authorizedkeysfile" or block is False:
            continue
        elif block is None:
            maybe.append(value)
        elif in_match and matched is None:
            matched = value
        elif not in_match and first is None:
            first = value
    files: list[str] = []
    chosen = matched if matched is not None else first or _DEFAULT_KEY_FILES
    for token in " ".join([chosen, *maybe]).split():
        token = token.strip('"')
        if token.lower() == "none":
            continue
        expanded = re.sub(
            r"%[%hUu]", lambda m: {"%%": "%", "%h": home, "%u": user, "%U": uid}[m[0]], token
        )
        if "%" in expanded.replace("%%", ""):
            return KeyFiles(
                user, unknown=f"AuthorizedKeysFile {token}: a token doctor cannot expand"
            )
        files.append(expanded if expanded.startswith("/") else f"{home}/{expanded}")
    return KeyFiles(user, tuple(dict.fromkeys(files)))


def _match_applies(criteria: str, user: str) -> bool | None:
    """Whether a ``Match`` line applies to ``user``: its keywords then override the
    global ones (sshd_config(5)). None when that depends on more than the user (an
    address, a group...)."""
    words = criteria.replace("=", " ").split()
    if [w.lower() for w in words] == ["all"]:
        return True
    if len(words) != 2 or words[0].lower() != "user":
        return None
    patterns = words[1].split(",")
    if any(p.startswith("!") and fnmatch.fnmatchcase(user, p[1:]) for p in patterns):
        return False
    return any(not p.startswith("!") and fnmatch.fnmatchcase(user, p) for p in patterns)


def check_key_files(results: tuple[CommandResult, ...]) -> tuple[tuple[Argv, Privilege], ...]:
    found = key_files(results[0].stdout) if results else KeyFiles("")
    if found.unknown or not found.files:
        return ()
    return (((SH, "-c", KEY_FILE_SCRIPT, "sh", *found.files), Privilege.NONE),)


def _authorized_keys(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    fix = (
        "make the file sshd reads the bot's key from root's: `AuthorizedKeysFile "
        "/etc/ssh/authorized_keys/%u` in sshd_config, that file root's, mode 0644, "
        f"holding the restricted entry (README: non-root hosts); sshd_config is read from "
        f"hosts.{p.host}.sshd_config"
    )
    found = key_files(a.results[0].stdout) if a.results else KeyFiles("")
    if a.error or found.unknown:
        return judged(
            p,
            Outcome.WARN,
            f"cannot tell which file sshd reads {cfg.user}'s keys "
            f"from ({a.error or found.unknown}), so not whether {cfg.user} can "
            "change its own key's restrictions",
            fix,
        )
    if not found.files:
        return judged(p, Outcome.OK, "sshd reads no authorized_keys file (AuthorizedKeysFile none)")
    said = dict(
        line.split("\t", 1)
        for line in (a.results[1].stdout if len(a.results) > 1 else "").splitlines()
        if "\t" in line
    )
    open_to = [
        f"{f} ({said[f].replace('owned', 'it owns').replace('writable', 'it can write')})"
        if f in said
        else f"{f} (not checked)"
        for f in found.files
        if said.get(f, "?") != "locked"
    ]
    if open_to:
        return judged(
            p,
            Outcome.WARN,
            f"{cfg.user} can change the file(s) sshd reads its keys "
            f"from: {'; '.join(open_to)}. Code running as {cfg.user} could add a key "
            "without restrict, from= or permitopen=",
            fix,
        )
    return judged(
        p,
        Outcome.OK,
        f"sshd reads {cfg.user}'s keys from {', '.join(found.files)}: "
        f"{cfg.user} cannot change them",
    )


JUDGES: dict[str, Callable[[Probe, Answer, Settings], Check]] = {
    "authorized_keys": _authorized_keys,
}
