"""Running as a non-root user: the sudoers rules the bot needs.

A host with ``become = "sudo"`` is reached as an ordinary account.  Each remote command
says which account it needs (``bot.core.privilege``); ``bot.core.become`` is the one
place that turns that into ``sudo -n -- <argv>`` (root) or ``sudo -n -u <venv_user> --
<argv>`` (the venv's owner), and explains sudo's refusals.  ``grants`` lists every
command line the bot may run under sudo for a service, built by the same argv builders
the flows use, so the rules ``render`` prints (``python -m bot sudoers``) always match
what the bot runs, and ``doctor`` checks each one with ``sudo -n -l``.

Why the venv owner and not root for installs: sudoers matches arguments literally or
with shell wildcards, and a wildcard (``*``) also matches spaces, so a rule that lets
the version vary (``vllm==*``) would let extra arguments through too (another index,
another package).  Run as root, that would be root for whoever holds the bot's key.
Run as the venv's owner, it is only what that account can already do: write its own
venv.  The rules for the unit (root) have no wildcard at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bot.core import privilege, remote, remote_releases
from bot.core.leftovers import ProcFacts, Signal, service_name, signal_command
from bot.core.privilege import SAFE_PATH, Privilege, run_as_of
from bot.core.sudoers_host import (
    HOST_NOTE,
    host_alias,
    host_grants,
    maintained_hosts,
)
from bot.core.sudoers_router import ROUTER_NOTE, router_alias, router_grants
from bot.core.sudoers_rules import Grant, Part, Wild, alias_head, alias_name
from bot.errors import ConfigError
from bot.settings import (
    ServiceSettings,
    Settings,
    maintenance_path_problem,
)

Argv = tuple[str, ...]

# The most lines `/vllm logs -n N` asks for (bot.slack.grammar.LOGS_MAX; a test keeps
# them equal): sudoers has no number ranges, so N is matched digit by digit.
LOGS_MAX = 1000
_LOG_COUNTS = ("[1-9]", "[1-9][0-9]", "[1-9][0-9][0-9]", "1000")
# sudoers matches a command by its absolute path; the bot runs its scripts with it.
SH = privilege.SH


def _bare(package: str) -> str:
    return package.split("[", 1)[0]


# ---- what the bot runs under sudo, per service -------------------------------------------


def _exact(argv: Argv, why: str) -> Grant:
    return Grant(run_as_of(argv), _absolute(argv), argv, why)


def _absolute(argv: Sequence[str]) -> Argv:
    return (SH, *argv[1:]) if argv[:1] == ("sh",) else tuple(argv)


def _with_glob(argv: Argv, sample: str, glob: str, why: str, at: int | None = None) -> Grant:
    """``argv``, built with ``sample`` in one argument (``at``, or the only one holding
    it): the rule has ``glob`` in its place, the rest of that argument literal."""
    rule = _absolute(argv)
    if at is None:
        holding = [i for i, a in enumerate(rule) if sample in a]
        assert len(holding) == 1, (sample, rule)
        at = holding[0]
    head, _, tail = rule[at].partition(sample)
    pattern: tuple[Part, ...] = (*rule[:at], Wild(head, glob, tail), *rule[at + 1 :])
    return Grant(run_as_of(argv), pattern, argv, why)


def _root_grants(svc: ServiceSettings) -> list[Grant]:
    grants = [
        _exact(remote.unit_show(svc), "read the unit's state (preflight, status, doctor)"),
        _exact(remote.unit_is_active(svc), "is the unit still active (the health gate)"),
        _exact(remote.unit_stop(svc), "stop the unit"),
        _exact(remote.unit_start(svc), "start the unit"),
    ]
    # Following a start's journal: where it is now, and its entries when it had none.
    # After a cursor (`--after-cursor=<cursor>`) there is no rule: the cursor changes
    # every time, and journalctl run as root with a wildcard there would take any option
    # (--vacuum-size deletes journals). So on these hosts the start-up progress shows no
    # journal lines; the health gate decides as ever.
    grants += [
        _exact(remote.journal_cursor(svc), "where the unit's journal is before a start"),
        _exact(
            remote.journal_follow(svc, None),
            "the start's journal lines, when the unit had none before it",
        ),
    ]
    # Ending leftover workers once an approver said so (bot.core.leftovers): the PIDs
    # (and their start times) vary, so the rule has a wildcard after the signal's name.
    signals: tuple[Signal, ...] = ("TERM", "KILL")
    for sig in signals:
        grants.append(
            _with_glob(
                signal_command(
                    sig, [_SAMPLE_PROC], svc.unit, svc.systemctl, ps=svc.ps, kill=svc.kill
                ),
                _SAMPLE_SPEC,
                "*",
                f"send {sig} to leftover workers an approver named (each "
                f"only while its start time is the one the bot read, and "
                f"only if it is in {service_name(svc.unit)}'s cgroup or a "
                f"VLLM:: process of its user in no unit)",
            )
        )
    if svc.journal_lines > LOGS_MAX:
        grants.append(
            _exact(
                remote.journal_tail(svc),
                "its journal tail after a failed health gate (journal_lines)",
            )
        )
    for counts in _LOG_COUNTS:
        sample = counts.replace("[1-9]", "1").replace("[0-9]", "0")
        argv = remote.journal_tail(svc, int(sample))
        if "[" not in counts:
            grants.append(_exact(argv, f"its journal tail, {counts} lines (/vllm logs -n N)"))
            continue
        digits = counts.count("[")
        grants.append(
            _with_glob(
                argv,
                sample,
                counts,
                f"its journal tail, {digits}-digit "
                "line counts (/vllm logs -n N, the tail after a failed "
                "health gate)",
                at=argv.index("-n") + 1,
            )
        )
    return grants


# A leftover worker as the signal's sample (its spec is what the rule's wildcard covers).
_SAMPLE_PROC = ProcFacts(
    pid=4242,
    state="S",
    user="vllm",
    started="Mon Jan 1 00:00:00 2024",
    cgroup="0::/system.slice/sample.service",
)
_SAMPLE_SPEC = "4242:Mon Jan 1 00:00:00 2024"

# Where a version or a file name goes in a rule, and the sample used in its place.
_VERSION_SAMPLE = "0.0.0.dev0"
_DIGEST_SAMPLE = "0123456789abcdef"


def _owner_grants(svc: ServiceSettings) -> list[Grant]:
    name = _bare(svc.package)
    pinned = f"{svc.package}=={_VERSION_SAMPLE}"
    lock = remote.lock_path(svc, _DIGEST_SAMPLE)
    return [
        # What runs the venv's interpreter (uv queries it; the gate imports from it): as
        # its owner, so a .pth file the owner planted runs as the owner, not as the login
        # that holds the root rules (issue 17, F2).
        _exact(
            remote.freeze(svc),
            "the environment snapshot (uv pip freeze; preflight, "
            "the request's package preview, the post-check)",
        ),
        _exact(remote.package_show(svc), f"the installed {name} version (uv pip show)"),
        _exact(
            remote.import_gate(svc),
            "the import gate: the venv's interpreter imports "
            "vllm and torch and prints their versions",
        ),
        _exact(
            remote.install_dry_run(svc, svc.package, None),
            "the install's dry run, latest version (preflight)",
        ),
        _with_glob(
            remote.install_dry_run(svc, pinned, None),
            _VERSION_SAMPLE,
            "*",
            "the install's dry run, a pinned version (preflight)",
        ),
        _exact(remote.install(svc, svc.package, None), "reinstall, latest version"),
        _with_glob(
            remote.install(svc, pinned, None), _VERSION_SAMPLE, "*", "reinstall, a pinned version"
        ),
        _with_glob(
            remote.install_previous(svc, _VERSION_SAMPLE, None),
            _VERSION_SAMPLE,
            "*",
            f"rollback: reinstall {name} at the version preflight recorded",
        ),
        _with_glob(
            remote.save_lock(svc, lock),
            _DIGEST_SAMPLE,
            "*",
            "keep the environment snapshot (a freeze) next to the venv",
        ),
        _exact(
            remote.prefetch(svc, None),
            "prefetch the new packages into uv's cache, through a throwaway venv",
        ),
        _exact(
            remote.prefetch(svc, None, check_flags=True),
            "the same prefetch, which also lists the new `vllm serve`'s options "
            "for the unit's flags",
        ),
        _with_glob(
            remote.sync_lock(svc, lock, offline=True),
            _DIGEST_SAMPLE,
            "*",
            "rollback: make the venv exactly the snapshot, from uv's cache",
        ),
        _with_glob(
            remote.sync_lock(svc, lock, offline=False),
            _DIGEST_SAMPLE,
            "*",
            "rollback: the same, from the index when the cache lacks a wheel",
        ),
    ]


# A release's name in a rule: the scripts take it last, refuse it unless it is one plain
# file name, and check their argument count, so the wildcard can add nothing after it.
_RELEASE_SAMPLE = f"{_VERSION_SAMPLE}-{_DIGEST_SAMPLE[:12]}"


def _release_grants(svc: ServiceSettings) -> list[Grant]:
    """A side-by-side service's: as the venv's owner, who owns the releases and the link."""
    return [
        _exact(
            remote_releases.releases_list(svc),
            "list the releases and the one the venv's link names",
        ),
        _with_glob(
            remote_releases.build_release(svc, _RELEASE_SAMPLE, None),
            _RELEASE_SAMPLE,
            "*",
            "build a new release beside the live one (uv venv, then the pinned set), and "
            "gate it with its own interpreter",
        ),
        _with_glob(
            remote_releases.build_release(svc, _RELEASE_SAMPLE, None, check_flags=True),
            _RELEASE_SAMPLE,
            "*",
            "the same build, which also lists the release's `vllm serve` options for the "
            "unit's flags",
        ),
        _with_glob(
            remote_releases.switch_release(svc, _RELEASE_SAMPLE),
            _RELEASE_SAMPLE,
            "*",
            "switch the venv's link to a release (a new link, then mv -T over the old one)",
        ),
        _with_glob(
            remote_releases.prune_releases(svc, (_RELEASE_SAMPLE,)),
            _RELEASE_SAMPLE,
            "*",
            "remove old releases (never the live one), or one its gate refused",
        ),
    ]


def grants(svc: ServiceSettings) -> list[Grant]:
    """Every command line the bot may run under sudo for ``svc``: as root (the unit), then
    as its ``venv_user`` (none when it has none: the login user installs itself)."""
    owner = _owner_grants(svc) if svc.venv_user else []
    if svc.venv_user and svc.strategy == "side_by_side":
        owner += _release_grants(svc)
    return _root_grants(svc) + owner


def rule_for(argv: Sequence[str], svc: ServiceSettings) -> Grant | None:
    """The grant that allows ``argv`` (as the builders made it, before ``become``)."""
    return next((g for g in grants(svc) if g.matches(_absolute(tuple(argv)))), None)


def alias(login: str, service: str, run_as: Privilege) -> str:
    """The Cmnd_Alias of ``service``'s rules for ``run_as`` in ``login``'s drop-in:
    CHATOPS__KIMI_K25_ROOT, CHATOPS__KIMI_K25_VENV (``alias_name``)."""
    return alias_name(login, service, "ROOT" if run_as == Privilege.ROOT else "VENV")


# ---- the drop-in file ------------------------------------------------------------------


def login_users(settings: Settings, hosts: Iterable[str] | None = None) -> list[str]:
    """The accounts the bot logs in as on hosts with ``become = "sudo"``."""
    names = settings.hosts if hosts is None else hosts
    return sorted(
        {
            settings.hosts[h].user
            for h in names
            if h in settings.hosts and settings.hosts[h].become == "sudo"
        }
    )


def services_on(settings: Settings, hosts: Iterable[str] | None) -> list[str]:
    """Services with a host among ``hosts`` (all when None) that uses sudo."""
    wanted = set(settings.hosts if hosts is None else hosts)
    return [
        name
        for name, svc in settings.services.items()
        if any(h in wanted and settings.hosts[h].become == "sudo" for h in svc.hosts)
    ]


_HEADER = """\
# vllm-chatops: the sudo rules for the bot's SSH account `{user}` (hosts with become = "sudo").
# Generated by `python -m bot sudoers --user {user}`; generate it again after changing a
# service's unit, venv, venv_user, tool paths or journal_lines, or [maintenance]'s tools.
#
# Install on each GPU host as root, checked before it is live (the installed name must
# have no "." in it: sudo skips such files in /etc/sudoers.d):
#   visudo -c -f vllm-chatops.sudoers && \\
#     install -o root -g root -m 0440 vllm-chatops.sudoers /etc/sudoers.d/vllm-chatops-{user}
# Then `visudo -c` must print no warning, and `python -m bot doctor` checks every rule
# below with `sudo -n -l`. Every alias name starts with {alias_head}__: sudo reads all
# drop-ins as one file, and a name another drop-in defined first would bind {user}'s
# rules to that file's commands.
#
# The bot runs each command below as `sudo -n -- <command>` (or `sudo -n -u <venv owner>
# -- <command>`): -n means sudo never asks for a password, so a missing rule fails the
# step at once with its name. A command with arguments in a rule allows exactly those
# arguments. Everything else the bot runs needs no rights and runs as {user} itself:
# nvidia-smi's queries, pgrep, ps, df, the health URL (fetched through the SSH connection). What
# runs the venv's interpreter (uv pip freeze and show, the import check) runs as the
# venv's owner: its code is the owner's to change.
#
# Each group of rules has its own `Defaults!<alias> env_reset, secure_path=...`: the
# commands get root's PATH, never {user}'s, even where sudo would keep the caller's
# (`Defaults !secure_path`, upstream sudo's default). `python -m bot doctor` fails on a
# host where that PATH does not apply to the bot's rules.
"""

_ROOT_NOTE = """\
# As root: only the commands on the unit, each exact (no wildcard, so no argument can
# name another unit or add an option), and the fixed script that ends leftover workers
# after an approver said so. Its wildcard takes the PIDs and their start times; the
# script itself (fixed in the rule, with the unit's name before the wildcard) signals a
# named PID only if the host says it is the unit's: in its cgroup, or a VLLM:: process
# of the unit's user in no unit. It only signals (TERM or KILL, never anything else) and
# skips a PID whose start time changed, so no PID outside the unit can be hit. The line
# counts of the journal tail are matched digit by digit ([1-9] is one digit), as sudoers
# has no number ranges. Reading the journal after a cursor (the start-up progress) has
# no rule: the cursor changes each time, and a wildcard would let journalctl take any
# option as root; without it the progress shows no journal lines, and the health gate
# decides as ever."""

_VENV_NOTE = """\
# As {owner}, the venv's owner: what writes the venv, and what runs its interpreter
# (uv pip freeze and show query it, the import gate imports from it): a .pth file in
# the venv runs whenever its interpreter starts, and {owner} can write one, so that
# code must run as {owner}, never as {user}. The version (and the snapshot's
# file name) changes per run, and a sudoers wildcard (*) also matches spaces, so these
# rules cannot stop extra arguments (another index or package) after the *. That is why
# they run as {owner} and not as root: {user} gets no more than {owner} can already do,
# write its own venv. Keep {owner} an account that owns the venv, its uv cache and
# {state} and nothing else (no sudo rights, no group that reaches other data).{index}"""

_INDEX_NOTE = """
# The index URL reaches uv in UV_EXTRA_INDEX_URL (never in an argv, where any user of
# the host could read its credentials): sudo keeps that variable for these commands."""


def render(
    settings: Settings, user: str, hosts: Iterable[str] | None = None, omit: Iterable[str] = ()
) -> str:
    """The sudoers drop-in for ``user`` on ``hosts`` (all configured hosts by default).
    ``omit``: rule lines (``Grant.line``) to leave out, for tests of a missing rule."""
    left_out = set(omit)
    _check_aliases(settings, user, hosts)
    out = [_HEADER.format(user=user, alias_head=alias_head(user))]
    for name in services_on(settings, hosts):
        svc = settings.services[name]
        out.append(
            f"\n# ==== service {name}: unit {svc.unit}, venv {svc.venv_dir}, "
            f"hosts {', '.join(svc.hosts)}"
        )
        root = [g for g in grants(svc) if g.run_as == Privilege.ROOT]
        out.append(
            _section(_ROOT_NOTE, alias(user, name, Privilege.ROOT), "root", user, root, left_out)
        )
        if not svc.venv_user:
            out.append(
                f"# No venv_user: {user} installs into {svc.venv_dir} itself, so it "
                "must own that venv."
            )
            continue
        owner = [g for g in grants(svc) if g.run_as == Privilege.VENV_OWNER]
        note = _VENV_NOTE.format(
            owner=svc.venv_user,
            user=user,
            state=remote.state_dir(svc),
            index=_INDEX_NOTE if svc.indexes else "",
        )
        venv_alias = alias(user, name, Privilege.VENV_OWNER)
        out.append("\n" + _section(note, venv_alias, svc.venv_user, user, owner, left_out))
        if svc.indexes:
            out.append(f'Defaults!{venv_alias} env_keep += "{remote.INDEX_ENV}"')
    maintained = maintained_hosts(settings, hosts)
    problems = [p for h in maintained if (p := maintenance_path_problem(settings, h))]
    if problems:
        out.append(f"\n# ==== host maintenance: no rules printed: {problems[0]}")
    elif maintained:
        out.append(f"\n# ==== host maintenance: hosts {', '.join(maintained)}")
        out.append(
            _section(
                HOST_NOTE,
                host_alias(user),
                "root",
                user,
                host_grants(settings.maintenance),
                left_out,
            )
        )
    for rname, rules in router_grants(settings, hosts):
        r = settings.routers[rname]
        out.append(f"\n# ==== router {rname}: haproxy backend {r.backend}, on {r.host}")
        out.append(
            _section(ROUTER_NOTE, router_alias(user, rname), "root", user, list(rules), left_out)
        )
    return "\n".join(out) + "\n"


def _check_aliases(settings: Settings, user: str, hosts: Iterable[str] | None) -> None:
    """Refuse two groups of rules that would share an alias name in one drop-in (services
    ``kimi.k25`` and ``kimi-k25``): sudo would bind both rules to the first group."""
    named: dict[str, str] = {}
    groups = [
        (alias(user, n, p), f"service {n}")
        for n in services_on(settings, hosts)
        for p in (Privilege.ROOT, Privilege.VENV_OWNER)
    ]
    groups.append((host_alias(user), "host maintenance"))
    groups += [(router_alias(user, r), f"router {r}") for r, _ in router_grants(settings, hosts)]
    for name, what in groups:
        if name in named:
            raise ConfigError(
                f"{named[name]} and {what} would share the sudoers alias {name}: rename one "
                "(alias names keep letters and digits only)"
            )
        named[name] = what


def _section(
    note: str, name: str, runas: str, user: str, rules: list[Grant], left_out: set[str]
) -> str:
    kept = [g for g in rules if g.line() not in left_out]
    lines = [note, f"# {name}, one command line each:"]
    lines += [f"#   {i}. {g.why}" for i, g in enumerate(kept, 1)]
    if not kept:
        return "\n".join(lines[:1])
    body = ", \\\n    ".join(g.line() for g in kept)
    lines.append(f"Cmnd_Alias {name} = \\\n    {body}")
    lines.append(f"{user} ALL = ({runas}) NOPASSWD: {name}")
    lines.append(safe_path_line(name))
    return "\n".join(lines)


def safe_path_line(name: str) -> str:
    """The Defaults line that gives the commands of Cmnd_Alias ``name`` root's PATH and a
    fresh environment, whatever the host's own Defaults say (command Defaults come last
    in sudo's order; checked with sudo 1.9.13p3 under `Defaults:<user> !secure_path`)."""
    return f'Defaults!{name} env_reset, secure_path="{SAFE_PATH}"'
