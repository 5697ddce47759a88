"""The commands of both front ends, in one table: name, arguments and help text.

The terminal's argparse parser (``bot.cli.main.build_parser``) and the Slack grammar
(``bot.slack.grammar``: its commands, each one's options and usage line, and the
``/vllm help`` list) are both built from ``COMMANDS``, so a command or an option added
here shows in each front end that has it (``fronts``), with its help. What a value must
be (a known service, a PEP 440 version, a number in range) stays each parser's job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, Flag, auto
from pathlib import Path


class Front(Flag):
    """Which front end has a command or an argument."""

    CLI = auto()  # python -m bot ...
    CHAT = auto()  # /vllm ... in Slack
    BOTH = CLI | CHAT


class Kind(Enum):
    VALUE = "value"  # a positional, or an option that takes a value
    FLAG = "flag"  # an option that takes none
    REPEAT = "repeat"  # an option that may repeat, each with a value
    REST = "rest"  # a positional taking every word left (GPU indexes), maybe none


@dataclass(frozen=True, slots=True)
class Arg:
    """One argument: ``names[0]`` is its name (``service``, ``--version``), the rest
    aliases (``-y``). ``shown``: how the chat usage line shows it or its value (``V``,
    ``host|service``); ``metavar``: how the terminal's help does (None: argparse's)."""

    names: tuple[str, ...]
    help: str | None = None
    kind: Kind = Kind.VALUE
    type: Callable[[str], object] = str
    default: object = None
    optional: bool = False  # a positional that may be left out
    metavar: str | None = None
    shown: str | None = None
    fronts: Front = Front.BOTH

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def positional(self) -> bool:
        return not self.name.startswith("-")

    def usage(self) -> str:
        """How the chat usage line shows it: ``<service>``, ``[--version V]``."""
        shown = self.shown or self.name
        if self.kind is Kind.REST:
            return f"[{shown} ...]"
        if self.positional:
            return f"[{shown}]" if self.optional else f"<{shown}>"
        return f"[{self.name}]" if self.kind is Kind.FLAG else f"[{self.name} {shown}]"


@dataclass(frozen=True, slots=True)
class Command:
    """One command: its terminal help line (``help``) and, where the chat's says more or
    other (it runs after approval, it is read-only), the ``/vllm help`` line (``chat``)."""

    name: str
    help: str
    args: tuple[Arg, ...] = ()
    fronts: Front = Front.BOTH
    chat: str | None = None

    def args_of(self, front: Front) -> tuple[Arg, ...]:
        return tuple(a for a in self.args if front in a.fronts)

    @property
    def chat_help(self) -> str:
        return self.chat or self.help

    def chat_usage(self) -> str:
        """The usage line after ``/vllm``: ``restart <service> [--force]``."""
        return " ".join([self.name, *(a.usage() for a in self.args_of(Front.CHAT))])


def _flag(*names: str, help: str | None = None, fronts: Front = Front.BOTH) -> Arg:
    return Arg(names, help, Kind.FLAG, fronts=fronts)


_SERVICE = Arg(("service",), shown="service")
_HOST = Arg(("host",), help="one of the service's hosts", shown="host")
_FORCE_ALL = "stop without waiting for in-flight requests"
# Issue 22: when a change runs, against its service's maintenance windows.
_AT = Arg(
    ("--at",),
    "approved now, it starts at TIME inside a maintenance window (02:00 in the "
    "window's time zone, 2026-12-04T02:00, or with an offset: 2026-12-04T01:00Z)",
    shown="TIME",
    metavar="TIME",
)
_NOW = _flag(
    "--now",
    help="emergency override outside the maintenance window (more approvals; recorded as such)",
)
_YES = "do not ask for confirmation"

# Options every terminal command takes, before or after its name.
GLOBAL_OPTIONS: tuple[Arg, ...] = (
    Arg(
        ("--config",),
        "TOML config (default: $CHATOPS_CONFIG or ./chatops.toml)",
        type=Path,
        fronts=Front.CLI,
    ),
    Arg(
        ("--db",),
        "audit database: a SQLite file or a postgresql:// URL (default: $CHATOPS_DB or "
        "./chatops.db; a password belongs in PGPASSWORD or ~/.pgpass, not here)",
        fronts=Front.CLI,
    ),
)

COMMANDS: tuple[Command, ...] = (
    Command("help", "this list", fronts=Front.CHAT),
    Command(
        "redeploy",
        "stop, drain, reinstall, start and health-check",
        (
            _SERVICE,
            Arg(("--version",), "pin a PEP 440 version (default: latest)", shown="V"),
            Arg(("--index",), "name of a package index from the service's config", shown="NAME"),
            _flag("--dry-run", help="preflight only; change nothing"),
            _AT,
            _NOW,
            Arg(
                ("--batch",),
                "hosts at a time (default: max_unavailable)",
                type=int,
                fronts=Front.CLI,
            ),
            _flag("--force", help=f"{_FORCE_ALL} (they are interrupted)"),
            _flag("--yes", "-y", help=_YES, fronts=Front.CLI),
            _flag(
                "--kill-leftovers",
                fronts=Front.CLI,
                help="if the service's own processes outlive its stop, terminate them "
                "(SIGTERM, then SIGKILL) without asking",
            ),
        ),
        chat="stop, drain, reinstall, start and health-check, after approval "
        "(--dry-run: preflight only, no approval needed)",
    ),
    Command(
        "restart",
        "stop, drain, start and health-check",
        (
            _SERVICE,
            _AT,
            _NOW,
            Arg(("--batch",), type=int, fronts=Front.CLI),
            _flag("--force", help=_FORCE_ALL),
            _flag("--yes", "-y", fronts=Front.CLI),
            _flag(
                "--kill-leftovers",
                fronts=Front.CLI,
                help="terminate the service's own processes that outlive its stop",
            ),
        ),
        chat="stop, drain, start and health-check, after approval",
    ),
    Command(
        "rollback",
        "switch a side-by-side service back to its previous release and restart it",
        (_SERVICE, _AT, _NOW, _flag("--yes", "-y", help=_YES, fronts=Front.CLI)),
        chat="switch a side-by-side service back to its previous release and restart it, "
        "after approval (nothing is installed)",
    ),
    Command(
        "status",
        "unit state, installed version and GPU table",
        (
            Arg(("service",), fronts=Front.CLI),
            Arg(("service",), optional=True, fronts=Front.CHAT),
        ),
        chat="unit state, installed version and GPU memory (read-only)",
    ),
    Command(
        "rotation",
        "each replica in or out of its router's rotation, its sessions and health",
        (_SERVICE,),
        chat="each replica in or out of its router's rotation, its sessions and health (read-only)",
    ),
    Command(
        "drain",
        "take one replica out of its router's rotation (the service keeps running)",
        (_SERVICE, _HOST, _flag("--yes", "-y", help=_YES, fronts=Front.CLI)),
        chat="take one replica out of its router's rotation, after approval (the service "
        "keeps running)",
    ),
    Command(
        "undrain",
        "put one replica back in its router's rotation, once it is ready",
        (_SERVICE, _HOST, _flag("--yes", "-y", help=_YES, fronts=Front.CLI)),
        chat="put one replica back in its router's rotation, after approval; an unready "
        "replica is refused",
    ),
    Command(
        "host",
        "a host's maintenance: every service on it drained and stopped, the host rebooted "
        "(reboot) or its GPUs reset (gpu-reset), the deep GPU check, the services started",
        (
            Arg(
                ("operation",),
                "reboot, or gpu-reset",
                shown="reboot|gpu-reset",
                metavar="{reboot,gpu-reset}",
            ),
            Arg(("host",), "a configured host that runs at least one service", shown="host"),
            Arg(
                ("gpus",),
                "gpu-reset: the GPU indexes (default: every GPU the host lists)",
                Kind.REST,
                type=int,
                shown="GPU",
                metavar="GPU",
            ),
            _AT,
            _NOW,
            _flag("--force", help=f"{_FORCE_ALL} on each service (they are interrupted)"),
            _flag("--yes", "-y", help=_YES, fronts=Front.CLI),
        ),
        chat="reboot a host, or reset its GPUs, after approval: every service on it drained "
        "and stopped first, the deep GPU check after, then the services started again",
    ),
    Command(
        "releases",
        "a side-by-side service's releases on each host: version, built, live",
        (_SERVICE,),
        chat="a side-by-side service's releases on each host: version, built, live (read-only)",
    ),
    Command(
        "gpus",
        "GPU memory on all hosts, a host, or a service's hosts",
        (
            Arg(("target",), optional=True, shown="host|service"),
            _flag("--local", help="probe this machine's GPUs via NVML", fronts=Front.CLI),
            Arg(("--timeout",), "per-host timeout (s)", type=float, default=10.0, fronts=Front.CLI),
            _flag(
                "--health",
                help="each GPU's health verdict, findings, NVIDIA's action and Xid lines",
            ),
            _flag(
                "--summary",
                help="only the counts per state and the hosts that need a look",
                fronts=Front.CLI,
            ),
            _flag(
                "--deep",
                help="the deep GPU check: health plus PCIe link, throttling, persistence, "
                "fabric, NVLink, driver mismatch, GPU count and dcgmi diag -r 1",
            ),
        ),
        chat="GPU memory on every host, one host, or a service's hosts",
    ),
    Command(
        "logs",
        "the service's journal tail",
        (
            _SERVICE,
            Arg(("-n",), shown="N"),
        ),
        fronts=Front.CHAT,
    ),
    Command(
        "audit",
        "who did what, when, approved by whom",
        (
            Arg(("target",), optional=True, shown="service|run-id", fronts=Front.CHAT),
            Arg(("--service",), fronts=Front.CLI),
            Arg(("--limit",), "the newest N runs (default: 20)", type=int, default=20, shown="N"),
            _flag("--json", help="a JSON array, with what each install changed", fronts=Front.CLI),
            Arg(
                ("--run",),
                "one run: its steps and what it did to the environment",
                type=int,
                metavar="N",
                fronts=Front.CLI,
            ),
            Arg(
                ("--format",),
                "jsonl: every run (its decisions, steps, package changes, snapshot "
                "digests), one JSON object a line, streamed (README: Audit export)",
                metavar="jsonl",
                fronts=Front.CLI,
            ),
            Arg(
                ("--since",),
                "with --format jsonl: runs requested at or after TIME (ISO 8601, UTC "
                "unless it says)",
                metavar="TIME",
                fronts=Front.CLI,
            ),
            Arg(
                ("--until",),
                "with --format jsonl: runs requested before TIME",
                metavar="TIME",
                fronts=Front.CLI,
            ),
            _flag(
                "--follow",
                help="with --format jsonl: then keep streaming each run as it finishes "
                "(finished runs only, each once)",
                fronts=Front.CLI,
            ),
        ),
        chat="recent runs: who asked, who approved, what happened",
    ),
    Command(
        "runs",
        "runs with their owners, leases and the locks they hold",
        (
            _flag("--active", help="every run awaiting approval, approved or running"),
            Arg(
                ("--limit",),
                "the newest N runs (default: 20); --active shows every active run",
                type=int,
                default=20,
            ),
            _flag(
                "--json",
                help="a JSON array (owner_alive: true, false, or null when nothing "
                "drives the run; owner_judged_by: process or lease)",
            ),
        ),
        fronts=Front.CLI,
    ),
    Command(
        "recover",
        "mark a run whose driver died interrupted; release its locks",
        (
            Arg(("run_id",), "the run's id, as `runs` or the busy refusal names it", type=int),
            _flag("--force", help="even though its owner looks alive"),
            _flag("--yes", "-y", help=_YES),
        ),
        fronts=Front.CLI,
    ),
    Command(
        "scheduled",
        "the runs approved for later (--at): when each starts; start what is due",
        (
            _flag(
                "--start-due",
                help="start the terminal's scheduled runs whose time has come, one after "
                "another, then exit (run it from a timer, e.g. every minute)",
            ),
            Arg(
                ("--cancel",),
                "cancel scheduled run N before it starts (recorded with your name)",
                type=int,
                metavar="N",
            ),
            _flag("--json", help="a JSON array"),
        ),
        fronts=Front.CLI,
    ),
    Command(
        "cancel",
        "cancel a pending or running run (requester or approvers)",
        (Arg(("run_id",), shown="run-id"),),
        fronts=Front.CHAT,
    ),
    Command(
        "demo",
        "full redeploy against an embedded simulated GPU host",
        (
            # The terminal's parser appends the fault names (bot.cli.demo_faults).
            Arg(
                ("--fault",),
                "inject a fault, may repeat (the README tells what each shows): ",
                Kind.REPEAT,
                default=(),
                metavar="FAULT",
            ),
            Arg(("--dir",), "where the demo keeps its audit DB (default: ./demo-run)", type=Path),
            _flag("--fast", help="shorten the simulated delays"),
        ),
        fronts=Front.CLI,
    ),
    Command(
        "sudoers",
        'print the sudoers drop-in for hosts with become = "sudo"',
        (
            Arg(("--user",), "the bot's SSH account (default: the hosts' user)"),
            Arg(("--host",), "only the services on this host (may repeat)", Kind.REPEAT),
        ),
        fronts=Front.CLI,
    ),
    Command(
        "doctor",
        "check each host and service end to end; changes nothing",
        (
            Arg(
                ("target",),
                "a host or a service (default: everything)",
                optional=True,
                shown="host|service",
            ),
            _flag("--json", fronts=Front.CLI),
        ),
        chat="check hosts and services end to end: SSH, host key, sudo rules, uv, GPUs, "
        "unit, venv, health URL, disk (read-only; requesters)",
    ),
    Command(
        "migrate",
        "apply the audit database's schema migrations (PostgreSQL: run once, before "
        "starting or upgrading the replicas; SQLite migrates itself on open)",
        fronts=Front.CLI,
    ),
    Command("serve", "run the Slack bot (the default)", fronts=Front.CLI),
)


def commands_of(front: Front) -> tuple[Command, ...]:
    """The commands ``front`` has, in table order."""
    return tuple(c for c in COMMANDS if front in c.fronts)
