"""The scripts and argv of side-by-side releases (issue 20, item 3): list a service's
releases, build one beside the live one, switch the venv's link, prune old ones. Fixed
scripts, every path and name an argument; each checks its directory as the snapshot's
writes do (``bot.core.remote.OWN_DIR``)."""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence

from bot.core.cuda import GATE_CODE
from bot.core.privilege import SAFE_PRELUDE, SH
from bot.core.remote import INDEX_ENV, OWN_DIR, Argv, as_owner, serve_help, with_index
from bot.settings import ServiceSettings

# ---- side-by-side releases (issue 20, item 3) -------------------------------------------
# The venv's path is a symlink into "<venv>.releases"; each release is a venv of its own.
# Every script gets the link's path first and finds the releases directory from it, so no
# argument can name a directory elsewhere; a release's name (the last arguments, the only
# ones a sudo rule lets vary) is refused unless it is one plain file name.
RELEASE_MARK = ".chatops-release"  # written last into a release: its build completed
BUILT_MARK = "chatops-built"  # on stdout: the release is built, what follows is the gate
REUSED_MARK = "chatops-reused"  # on stdout: a complete release of that name was there
SWITCHED_MARK = "chatops-switched"
LIVE_PREFIX = "live "
RELEASE_PREFIX = "release "

_NAME_OK = (
    'case $name in ""|.|..|-*|*[!A-Za-z0-9._+-]*) echo "not a release name: $name" >&2; '
    "exit 2;; esac; "
)

# Lists the link's target and each complete release with when its build ended (the
# mark's mtime, seconds since the epoch, to the nanosecond: two builds in one second
# still sort). Read-only. No backslash anywhere (`-printf "...\n"`): real sudo then
# matched no rule however the rule escaped it, so each line is echo's.
RELEASES_LIST = (
    SAFE_PRELUDE + 'set -f; link=$1; [ $# -eq 1 ] || exit 2; rels="$link.releases"; '
    't=$(readlink -- "$link") || { echo "$link is not a symbolic link" >&2; exit 3; }; '
    f'echo "live $t"; set +f; for m in "$rels"/*/{RELEASE_MARK}; do [ -f "$m" ] || continue; '
    't=$(find "$m" -maxdepth 0 -printf %T@) || continue; echo "release $t ${m%/*}"; done'
)

# Builds release "$7" beside the live one, as the prefetch does its throwaway venv (uv
# found before PATH is fixed; the pinned set on stdin, after the index URL when there is
# one), in place: a venv's scripts name its own path (`#!<release>/bin/python`), so it
# can never be built elsewhere and moved. A name already built is reused; a directory of
# that name without the mark (a build cut short) is refused, never removed here (it could
# be someone's). A failed build removes what it made (the trap). Then the release's own
# interpreter runs the import gate, bounded by gate_timeout_s ("$4"). umask 022: the
# unit's account, maybe not the venv's owner, must read the release.
BUILD_RELEASE = (
    'uv=$(command -v -- "$2") || { echo "$2: not found" >&2; exit 127; }; '
    + SAFE_PRELUDE
    + "[ $# -eq 7 ] || exit 2; set -f; link=$1; py=$3; gt=$4; gc=$5; hm=$6; name=$7; "
    + _NAME_OK
    + 'rels="$link.releases"; rel="$rels/$name"; umask 022; mkdir -p -- "$rels" || exit 1; '
    "dir=$rels; " + OWN_DIR + f'if [ -e "$rel/{RELEASE_MARK}" ]; then echo {REUSED_MARK}; '
    'elif [ -e "$rel" ] || [ -L "$rel" ]; then echo "$rel exists but is not a complete '
    'release: remove it, then ask again" >&2; exit 1; '
    "else ( set -e; trap 'rm -rf -- \"$rel\"' EXIT; trap 'exit 143' HUP INT TERM; "
    '"$uv" venv --quiet --python "$py" "$rel"; '
    '"$uv" pip install --python "$rel/bin/python" --no-deps -r /dev/stdin; '
    # Not `( ... ) || exit`: set -e is off in a command that `||` follows (POSIX).
    f'echo "$name" > "$rel/{RELEASE_MARK}"; trap - EXIT ); st=$?; [ $st -eq 0 ] || exit $st; '
    "fi; "
    f"echo {BUILT_MARK}; "
    'timeout -k 10 "$gt" "$rel/bin/python" -c "$gc" || exit $?; '
    # Then, where the unit starts `vllm serve` ("$6"), the release's own option list.
     + serve_help("$rel")
)

# Points the link at release "$2", atomically: a new link beside it, then rename(2) over
# the old one (`mv -T`: never into a directory at that name). Only in a directory its own
# account (or root) owns and no other can write (``OWN_DIR``): the new link's name is
# then nobody else's to plant. The old target is printed, for the audit log.
SWITCH_RELEASE = (
    SAFE_PRELUDE
    + "[ $# -eq 2 ] || exit 2; set -f; link=$1; name=$2; "
    + _NAME_OK
    + 'rel="$link.releases/$name"; dir=${link%/*}; dir=${dir:-/}; '
    + OWN_DIR
    + f'[ -d "$rel" ] && [ ! -L "$rel" ] && [ -e "$rel/{RELEASE_MARK}" ] || '
    '{ echo "$rel is not a built release" >&2; exit 1; }; '
    'old=$(readlink -- "$link") || { echo "$link is not a symbolic link: convert the venv '
    'first (README: side-by-side releases)" >&2; exit 1; }; '
    'new="$link.new.$$"; rm -f -- "$new"; '
    'if ln -s -- "$rel" "$new" && mv -f -T -- "$new" "$link"; then '
    f'echo "{SWITCHED_MARK} $old -> $rel"; exit 0; fi; rm -f -- "$new"; exit 1'
)

# Removes the named releases ("$2"...), never the one the link points at.
PRUNE_RELEASES = (
    SAFE_PRELUDE + '[ $# -ge 2 ] || exit 2; set -f; link=$1; shift; rels="$link.releases"; '
    'live=$(readlink -f -- "$link") || live=; dir=$rels; '
    'for name in "$@"; do ' + _NAME_OK + 'done; keep="$*"; ' + OWN_DIR + "set -- $keep; "
    'for name in "$@"; do rel="$rels/$name"; '
    'if [ "$(readlink -f -- "$rel")" = "$live" ]; then echo "kept $name: it is live"; '
    'elif rm -rf -- "$rel"; then echo "removed $name"; else exit 1; fi; done'
)


def release_name(version: str | None, pins: str) -> str:
    """``<version>-<12 hex of the pinned set's SHA-256>``: the same set always gets the
    same name, another build of one version another. Only characters a file name and a
    sudo rule take as they are."""
    digest = hashlib.sha256(pins.encode()).hexdigest()[:12]
    v = re.sub(r"[^A-Za-z0-9._+]", "_", version or "unknown").lstrip(".-") or "unknown"
    return f"{v}-{digest}"


def releases_list(svc: ServiceSettings) -> Argv:
    return as_owner(SH, "-c", RELEASES_LIST, "sh", svc.venv_dir)


def build_release(
    svc: ServiceSettings, name: str, index_url: str | None, *, check_flags: bool = False
) -> Argv:
    """Build release ``name`` from the pinned set on stdin, then gate it; with
    ``check_flags``, also list its ``vllm serve``'s options."""
    return with_index(
        as_owner(
            SH,
            "-c",
            BUILD_RELEASE,
            "sh",
            svc.venv_dir,
            svc.uv,
            svc.python,
            f"{svc.gate_timeout_s:g}",
            GATE_CODE,
            "serve" if check_flags else "none",
            name,
        ),
        index_url,
    )


def build_release_shown(svc: ServiceSettings, index_url: str | None, name: str) -> str:
    rel = f"{svc.releases_dir}/{name}"
    index = f"{INDEX_ENV}=<index URL, on stdin> " if index_url else ""
    return (
        f"{shlex.join((svc.uv, 'venv', '--python', svc.python, rel))} && {index}"
        f"{shlex.join((svc.uv, 'pip', 'install', '--python', rel + '/bin/python'))} "
        f"--no-deps -r <the dry run's pinned set> && "
        f"{shlex.quote(rel + '/bin/python')} -c 'import vllm, torch' (the import and CUDA "
        "gate, before the stop; a refused release is removed)"
    )


def switch_release(svc: ServiceSettings, name: str) -> Argv:
    return as_owner(SH, "-c", SWITCH_RELEASE, "sh", svc.venv_dir, name)


def switch_shown(svc: ServiceSettings, name: str) -> str:
    """The switch as an operator would type it (the card, a rollback by hand)."""
    new = shlex.quote(f"{svc.venv_dir}.new")
    return (
        f"ln -s {shlex.quote(f'{svc.releases_dir}/{name}')} {new} && "
        f"mv -f -T {new} {shlex.quote(svc.venv_dir)}"
    )


def prune_releases(svc: ServiceSettings, names: Sequence[str]) -> Argv:
    return as_owner(SH, "-c", PRUNE_RELEASES, "sh", svc.venv_dir, *names)
