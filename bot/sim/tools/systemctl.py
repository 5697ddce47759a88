"""Simulated ``systemctl``: show, start, stop, restart, is-active, status, reset-failed,
enable, disable, is-enabled and reboot (issue 23: ``bot.sim.power``).

Output, ordering and exit codes follow systemd 252: ``show`` prints properties
in systemd's own order whatever order ``-p`` named them in; an unknown unit is
``LoadState=not-found`` with exit 0; ``is-active`` exits 3 unless active;
start/stop of an unknown unit exit 5. ``reboot`` prints nothing: the connection it came
in on is dropped before its exit status could arrive (``bot.sim.power``). ``enable`` and
``disable`` print systemd's symlink lines on stderr; ``is-enabled`` exits 1 unless enabled.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from bot.sim import power
from bot.sim.state import HostState, Run, StateStore, exec_start, host_view, main_pid, unit_state
from bot.sim.tools import journalctl, unit

# The order systemd itself prints these in.
_ORDER = (
    "Type",
    "Restart",
    "MainPID",
    "ExecMainStartTimestamp",
    "ExecMainPID",
    "Result",
    "NRestarts",
    "Id",
    "Names",
    "Description",
    "LoadState",
    "ActiveState",
    "SubState",
    "FragmentPath",
    "UnitFileState",
    "ActiveEnterTimestamp",
    "InactiveEnterTimestamp",
    "LoadError",
    "User",
    "ExecStart",
    "Environment",
    "EnvironmentFiles",
)
_NEEDS_UNIT = (
    "start",
    "stop",
    "restart",
    "is-active",
    "reset-failed",
    "enable",
    "disable",
    "is-enabled",
)
_WANTS = "/etc/systemd/system/multi-user.target.wants"


def _stamp(ts: float | None) -> str:
    return "" if ts is None else time.strftime("%a %Y-%m-%d %H:%M:%S %Z", time.localtime(ts))


def _properties(st: HostState, name: str, now: float) -> dict[str, str | tuple[str, ...]]:
    svc = unit.service_name(name)
    if not unit.is_ours(st, name):
        return {
            "MainPID": "0",
            "Result": "success",
            "Id": svc,
            "Names": svc,
            "Description": svc,
            "LoadState": "not-found",
            "ActiveState": "inactive",
            "SubState": "dead",
            "UnitFileState": "",
            "LoadError": f'org.freedesktop.systemd1.NoSuchUnit "Unit {svc} not found."',
        }
    run = st.run
    active, sub = unit_state(run, now)
    ended = run.stopped_at if active in ("inactive", "deactivating") else run.fail_at
    return {
        "Type": "simple",
        "Restart": "no",
        "MainPID": str(main_pid(run, now)),
        "ExecMainStartTimestamp": _stamp(run.started_at),
        "ExecMainPID": str(run.main_pid),
        "Result": "exit-code" if active == "failed" else "success",
        "NRestarts": "0",
        "Id": svc,
        "Names": svc,
        "Description": st.config.description,
        "LoadState": "loaded",
        "ActiveState": active,
        "SubState": sub,
        "FragmentPath": f"/etc/systemd/system/{svc}",
        "UnitFileState": _enabled(st),
        "ActiveEnterTimestamp": _stamp(run.started_at),
        "InactiveEnterTimestamp": _stamp(ended if active != "active" else None),
        "User": st.config.unit_user,
        "ExecStart": _exec_start(st, run, now),
        "Environment": " ".join(_quoted(a) for a in st.config.unit_environment),
        # One line per file, none without (systemctl-show.c; tests/samples/systemd_env/).
        "EnvironmentFiles": tuple(
            f"{p.removeprefix('-')} (ignore_errors={'yes' if p.startswith('-') else 'no'})"
            for p in st.config.unit_env_files
        ),
    }


# What makes systemd's shell_maybe_quote() put a word in double quotes (escape.h:
# whitespace, SHELL_NEED_QUOTES), and the characters it puts a `\` before inside them.
_NEEDS_QUOTES = frozenset(" \t\n\r\"\\`$*?['()<>|&;!")
_ESCAPED = frozenset('"\\`$')


def _quoted(word: str) -> str:
    """An Environment= assignment as `systemctl show` prints it (systemd 252:
    tests/samples/systemd_env/systemctl_show_exec_env_252.txt)."""
    if not any(c in _NEEDS_QUOTES or ord(c) < 32 for c in word):
        return word
    return '"' + "".join("\\" + c if c in _ESCAPED else c for c in word) + '"'


def _enabled(st: HostState) -> str:
    return "enabled" if st.unit_enabled else "disabled"


def _exec_start(st: HostState, run: Run, now: float) -> str:
    """As systemd 252 prints it (systemd/systemd#16051): the arguments joined by spaces,
    unquoted, then the last run's times and status."""
    argv = exec_start(st)
    pid = main_pid(run, now)
    return (
        f"{{ path={argv[0]} ; argv[]={' '.join(argv)} ; ignore_errors=no ; "
        f"start_time=[{_stamp(run.started_at) or 'n/a'}] ; stop_time=[n/a] ; "
        f"pid={pid} ; code={'(null)' if pid else 'exited'} ; status=0/0 }}"
    )


def _show(st: HostState, units: list[str], props: list[str], value_only: bool) -> int:
    now = time.time()
    blocks = []
    for name in units:
        values = _properties(st, name, now)
        keys = [k for k in _ORDER if k in values and (not props or k in props)]
        blocks.append(
            "".join(
                v + "\n" if value_only else f"{k}={v}\n" for k in keys for v in _lines(values[k])
            )
        )
    sys.stdout.write("\n".join(blocks))
    return 0


def _lines(value: str | tuple[str, ...]) -> tuple[str, ...]:
    """A property's lines: one, or one per item for a list systemctl prints that way."""
    return value if isinstance(value, tuple) else (value,)


def _ago(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s}s ago"
    if s < 3600:
        return f"{s // 60}min {s % 60}s ago"
    return f"{s // 3600}h {s % 3600 // 60}min ago"


def _status(store: StateStore, st: HostState, name: str, lines: int) -> int:
    svc = unit.service_name(name)
    if not unit.is_ours(st, name):
        print(f"Unit {svc} could not be found.", file=sys.stderr)
        return 4
    now, run = time.time(), st.run
    active, sub = unit_state(run, now)
    since = run.started_at if active == "active" else (run.fail_at or run.stopped_at)
    mark = {"active": "●", "failed": "×"}.get(active, "○")
    result = " (Result: exit-code)" if active == "failed" else f" ({sub})"
    out = [
        f"{mark} {svc} - {st.config.description}",
        f"     Loaded: loaded (/etc/systemd/system/{svc}; {_enabled(st)}; preset: enabled)",
    ]
    when = "" if since is None else f" since {_stamp(since)}; {_ago(now - since)}"
    out.append(f"     Active: {active}{result}{when}")
    pid = main_pid(run, now)
    if pid:
        out.append(f"   Main PID: {pid} (python3)")
        procs = host_view(st, now)[1]
        out.append(f"     CGroup: /system.slice/{svc}")
        out += [
            f"             {'└─' if i == len(procs) - 1 else '├─'}{p.pid} {p.cmdline}"
            for i, p in enumerate(procs)
        ]
    journal = journalctl.lines(store, st, lines)
    sys.stdout.write("\n".join(out) + "\n" + ("\n" + "\n".join(journal) + "\n" if journal else ""))
    return 0 if active == "active" else 3


def _restart(store: StateStore) -> None:
    unit.stop(store)
    unit.start(store)


_JOBS: dict[str, Callable[[StateStore], None]] = {
    "start": unit.start,
    "stop": unit.stop,
    "restart": _restart,
}


def _each(
    store: StateStore,
    st: HostState,
    units: list[str],
    what: str,
    action: Callable[[StateStore], None],
) -> int:
    for name in units:
        if not unit.is_ours(st, name):
            svc = unit.service_name(name)
            # systemd words it "not loaded" for stop-like jobs and "not found" for start-like.
            why = "not found" if what in ("start", "restart") else "not loaded"
            print(f"Failed to {what} {svc}: Unit {svc} {why}.", file=sys.stderr)
            return 5 if what in _JOBS else 1
        action(store)
    return 0


class _Usage(Exception):
    """A command line systemctl itself rejects (exit 1, the message on stderr)."""


@dataclass
class _Args:
    verb: str = ""
    units: list[str] = field(default_factory=list)
    props: list[str] = field(default_factory=list)
    value_only: bool = False
    quiet: bool = False
    lines: int = 10


_IGNORED = frozenset({"--no-pager", "--no-block", "--no-legend", "--full", "-l", "--plain"})


def _property_option(a: str, it: Iterator[str]) -> list[str] | None:
    """The properties a -p/--property option names, or None when ``a`` is not one."""
    if a in ("-p", "--property"):
        return next(it, "").split(",")
    if a.startswith("--property="):
        return a.split("=", 1)[1].split(",")
    if a.startswith("-p") and len(a) > 2 and not a.startswith("--"):
        return a[2:].split(",")
    return None


def _lines_option(a: str, it: Iterator[str]) -> int:
    value = a.split("=", 1)[1] if "=" in a else next(it, "")
    if not value.isdigit():
        raise _Usage(f"Failed to parse lines '{value}'")
    return int(value)


def _parse(args: list[str]) -> _Args:
    parsed = _Args()
    positional: list[str] = []
    it = iter(args)
    for a in it:
        if a == "--":  # getopt: the rest are operands, even those that start with "-"
            positional += it
            break
        props = _property_option(a, it)
        if props is not None:
            parsed.props += props
        elif a in ("-n", "--lines") or a.startswith("--lines="):
            parsed.lines = _lines_option(a, it)
        elif a == "--value":
            parsed.value_only = True
        elif a in ("-q", "--quiet"):
            parsed.quiet = True
        elif a.startswith("-") and a not in _IGNORED:
            raise _Usage(f"systemctl: unrecognized option '{a}'")
        elif not a.startswith("-"):
            positional.append(a)
    parsed.verb, parsed.units = _verb_and_units(positional)
    return parsed


def _verb_and_units(operands: list[str]) -> tuple[str, list[str]]:
    if not operands or (operands[0] in _NEEDS_UNIT and len(operands) < 2):
        raise _Usage("Too few arguments.")
    return operands[0], operands[1:]


def _is_active(st: HostState, units: list[str], quiet: bool) -> int:
    states = [
        unit_state(st.run, time.time())[0] if unit.is_ours(st, u) else "inactive" for u in units
    ]
    if not quiet:
        sys.stdout.write("".join(s + "\n" for s in states))
    return 0 if "active" in states else 3


def _is_enabled(st: HostState, units: list[str], quiet: bool) -> int:
    for u in units:
        if not unit.is_ours(st, u):
            svc = unit.service_name(u)
            print(
                f"Failed to get unit file state for {svc}: No such file or directory",
                file=sys.stderr,
            )
            return 1
    states = [_enabled(st) for _ in units]
    if not quiet:
        sys.stdout.write("".join(s + "\n" for s in states))
    return 0 if "enabled" in states else 1


def _set_enabled(store: StateStore, st: HostState, units: list[str], on: bool) -> int:
    for u in units:
        svc = unit.service_name(u)
        if not unit.is_ours(st, u):
            print(
                f"Failed to {'enable' if on else 'disable'} unit: Unit file {svc} does not exist.",
                file=sys.stderr,
            )
            return 1
    with store.transaction() as tx:
        was = tx.state.unit_enabled
        tx.state = replace(tx.state, unit_enabled=on)
    svc = unit.service_name(st.config.unit)
    if on and not was:
        print(f"Created symlink {_WANTS}/{svc} \u2192 /etc/systemd/system/{svc}.", file=sys.stderr)
    elif was and not on:
        print(f'Removed "{_WANTS}/{svc}".', file=sys.stderr)
    return 0


def main(store: StateStore, args: list[str]) -> int:
    try:
        a = _parse(args)
    except _Usage as e:
        print(e, file=sys.stderr)
        return 1
    st = store.read()
    if a.verb == "show":
        return _show(st, a.units, a.props, a.value_only)
    if a.verb == "status":
        return max(_status(store, st, u, a.lines) for u in a.units) if a.units else 0
    if a.verb == "is-active":
        return _is_active(st, a.units, a.quiet)
    if a.verb == "reset-failed":
        return _each(store, st, a.units, "reset failed state of unit", unit.reset_failed)
    if a.verb in ("enable", "disable"):
        return _set_enabled(store, st, a.units, a.verb == "enable")
    if a.verb == "is-enabled":
        return _is_enabled(st, a.units, a.quiet)
    if a.verb == "reboot":
        sys.stdout.flush()
        power.reboot(store)
        # Before its exit status is sent: the real sshd's connections, or this session.
        if not power.drop_connections(store, everyone=True):
            power.end_embedded_session(st.owner_pid)
        return 0
    if a.verb in _JOBS:
        return _each(store, st, a.units, a.verb, _JOBS[a.verb])
    print(f"Unknown command verb '{a.verb}'.", file=sys.stderr)
    return 1
