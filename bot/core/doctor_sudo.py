"""``doctor``'s sudo checks: what ``sudo -n -l`` lists beyond what the bot needs, whether
sudo gives the bot's commands root's PATH, and whether every rule the bot needs is granted."""

from __future__ import annotations

import re
from collections.abc import Callable

from bot.core.doctor_types import SUDOERS_FIX, Answer, Check, Outcome, Probe, judged, reply
from bot.core.privilege import Privilege, sudo_refusal
from bot.core.sudoers import alias, grants
from bot.core.sudoers_host import host_alias, host_grants
from bot.core.sudoers_router import router_alias, router_grants
from bot.settings import Settings

_ENTRY = re.compile(r"\((?P<runas>[^)]*)\)\s+(?:[A-Z_]+:\s*)*(?P<cmds>.*)")


def parse_sudo_list(text: str) -> list[tuple[str, str]]:
    """(run-as, command) for each command ``sudo -l`` lists, as sudoers writes it.  Entries
    start 4 spaces in; sudo wraps long ones onto lines 8 spaces in, at a space."""
    entries: list[str] = []
    listing = False
    for line in text.splitlines():
        if " may run the following commands on " in line:
            listing = True
        elif listing and line.startswith("        ") and entries:
            entries[-1] += " " + line.strip()
        elif listing and line.startswith("    "):
            entries.append(line.strip())
        elif listing and line.strip():
            listing = False
    out = []
    for entry in entries:
        m = _ENTRY.fullmatch(entry)
        if m:
            out += [(m["runas"].strip(), c.strip()) for c in re.split(r"(?<!\\), ", m["cmds"])]
    return out


def _ours(s: Settings) -> set[tuple[str, str]]:
    return (
        {
            ("root" if g.run_as == Privilege.ROOT else svc.venv_user or "", g.line())
            for svc in s.services.values()
            for g in grants(svc)
        }
        | {("root", g.line()) for g in host_grants(s.maintenance)}
        | {("root", g.line()) for _, rules in router_grants(s, None) for g in rules}
    )


# sudo's warning, on stderr of every sudo command, when a second sudoers file defines an
# alias again (Debian 12's sudo 1.9.13p3: `<file>:<line>:<column>: Alias "NAME" already
# defined`, then the line and a caret; tests/samples/sudo_alias_already_defined.txt).
_ALIAS_AGAIN = re.compile(
    r"(?:(?P<where>\S+?:\d+):\d+: )?Alias [\"`'](?P<alias>[^\"`']+)[\"'] already defined"
)


def duplicate_aliases(stderr: str) -> list[str]:
    """Each alias sudo says is defined twice, with where the second definition is."""
    return [
        f"{m['alias']} ({m['where']})" if m["where"] else m["alias"]
        for m in _ALIAS_AGAIN.finditer(stderr)
    ]


def _sudo_list(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        why = a.error or (reply(r) if r else "no answer")
        return judged(
            p, Outcome.FAIL, f"`sudo -n -l` failed: {why}", SUDOERS_FIX.format(user=cfg.user)
        )
    if again := duplicate_aliases(r.stderr):
        # sudo keeps the first definition: a rule naming the alias in a later file gets
        # that file's commands, another login's or another tool's.
        return judged(
            p,
            Outcome.FAIL,
            f"sudo says an alias is defined twice on this host: {'; '.join(again)}; sudo "
            f"keeps the first definition, so {cfg.user}'s rules may allow another "
            "drop-in's commands instead of the bot's",
            SUDOERS_FIX.format(user=cfg.user) + " in place of the old drop-in (its alias "
            "names start with the login); `visudo -c` must then print no warning",
        )
    listed = parse_sudo_list(r.stdout)
    broad = [f"({who}) {cmd}" for who, cmd in listed if cmd == "ALL"]
    if broad:
        return judged(
            p,
            Outcome.WARN,
            f"{cfg.user} may run any command: {'; '.join(broad)}",
            f"remove {cfg.user} from admin groups (sudo, wheel) and rules with ALL; "
            "the bot needs only the rules `python -m bot sudoers` prints",
        )
    extra = [f"({who}) {cmd}" for who, cmd in listed if (who, cmd) not in _ours(s)]
    if extra:
        return judged(
            p,
            Outcome.WARN,
            f"{len(extra)} rule(s) beyond what the bot needs: " + "; ".join(extra),
            "remove them, or check they are meant for this account",
        )
    return judged(p, Outcome.OK, f"{len(listed)} rules, none beyond what the bot needs")


# ---- whether sudo gives the bot's commands root's PATH (issue 17, F1) ----------------
# `sudo -n -l` lists the Defaults that apply to the account ("Matching Defaults entries":
# global, host and user ones, in order, the last of each option winning), then those
# bound to a run-as account (`Defaults>root`) or to commands (`Defaults!<commands>`),
# which sudo applies after them, each entry its bound list and then its options. Read
# from Debian 12's sudo 1.9.13p3 (tests/samples/sudo_l_*.txt): without a terminal an
# entry is one line; on one, sudo wraps it at a space onto lines 4 spaces in. In a
# command sudoers escapes "=" and "!", so an unescaped `secure_path=` or `!secure_path`
# there is an option, never part of a command.
_SECURE_PATH = re.compile(
    r"(?:^|[ ,])(?P<neg>!)?secure_path(?:=(?P<value>(?:\\.|[^,\s])*))?"
    r"(?=,|\s|$)"
)


def parse_sudo_defaults(text: str) -> tuple[str, list[str]]:
    """The account's matching Defaults options (one string) and each run-as or command
    bound entry (``>root opts`` or ``!cmd, cmd opts``), from ``sudo -l``."""
    options: list[str] = []
    bound: list[str] = []
    section = ""
    for line in text.splitlines():
        if line.startswith("Matching Defaults entries for "):
            section = "matching"
        elif line.startswith("Runas and Command-specific defaults for "):
            section = "bound"
        elif not line.startswith(" ") or not line.strip():
            section = "" if line.strip() else section
        elif section == "matching":
            options.append(line.strip())
        elif section == "bound" and line.startswith("    Defaults"):
            bound.append(line.strip()[len("Defaults") :])
        elif section == "bound" and bound:
            bound[-1] += " " + line.strip()
    return " ".join(options), bound


def _last_secure_path(options: str) -> tuple[bool, str | None]:
    """(whether the options say anything about secure_path, its value or None if unset)."""
    found = list(_SECURE_PATH.finditer(options))
    if not found:
        return False, None
    last = found[-1]
    if last["neg"] or last["value"] is None:
        return True, None
    return True, re.sub(r"\\(.)", r"\1", last["value"])


def _bound_to(entry: str, runas: str, line: str) -> bool:
    """Whether a bound Defaults entry applies to ``line`` run as ``runas``."""
    if entry.startswith(">"):
        m = re.match(r"((?:[^,\s]+, )*[^,\s]+) ", entry[1:])
        return m is not None and runas in m[1].split(", ")
    if entry.startswith("!"):
        listed = entry[1:]
        return any(
            listed.startswith(line + sep) or f", {line}{sep}" in listed for sep in (", ", " ")
        )
    return False


def secure_path_for(listing: tuple[str, list[str]], runas: str, line: str) -> str | None:
    """The PATH sudo gives ``line`` (a rule as ``Grant.line`` writes it) run as
    ``runas``: a command's own Defaults, else its run-as account's, else the account's;
    None when none sets secure_path (sudo then keeps the caller's PATH)."""
    options, bound = listing
    for level in ("!", ">"):
        said = [
            _last_secure_path(e) for e in bound if e.startswith(level) and _bound_to(e, runas, line)
        ]
        said = [x for x in said if x[0]]
        if said:
            return said[-1][1]
    return _last_secure_path(options)[1]


def _sudo_path(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        why = a.error or (reply(r) if r else "no answer")
        return judged(
            p, Outcome.FAIL, f"`sudo -n -l` failed: {why}", SUDOERS_FIX.format(user=cfg.user)
        )
    listing = parse_sudo_defaults(r.stdout)
    ours = [
        (
            alias(cfg.user, name, g.run_as),
            g,
            "root" if g.run_as == Privilege.ROOT else svc.venv_user or "",
        )
        for name, svc in s.services.items()
        if p.host in svc.hosts
        for g in grants(svc)
    ] + [
        (router_alias(cfg.user, name), g, "root")
        for name, rules in router_grants(s, [p.host])
        for g in rules
    ]
    bad: list[str] = []
    paths: set[str] = set()
    for name, g, runas in ours:
        path = secure_path_for(listing, runas, g.line())
        if path is None or not all(d.startswith("/") for d in path.split(":")):
            bad.append(f"{name}: `{g.line()[:80]}`" + ("" if path is None else f" ({path})"))
        else:
            paths.add(path)
    if bad:
        return judged(
            p,
            Outcome.FAIL,
            f"sudo keeps {cfg.user}'s own PATH (no secure_path, or "
            f"one with a relative directory) for {len(bad)} of {len(ours)} rules, "
            "so a command the bot runs by name there would be the one "
            f"{cfg.user} puts first: " + "; ".join(bad[:3]),
            SUDOERS_FIX.format(user=cfg.user) + ": its `Defaults!<alias> "
            "env_reset, secure_path=...` lines give the rules root's PATH",
        )
    return judged(
        p, Outcome.OK, f"secure_path applies to all {len(ours)} rules: " + ", ".join(sorted(paths))
    )


def _sudo_rules(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    svc = s.services[p.service]
    if a.error:
        return judged(p, Outcome.FAIL, a.error)
    missing = [
        f"{alias(s.hosts[p.host].user, p.service, g.run_as)}: `{g.line()}` ({g.why})"
        for g, r in zip(grants(svc), a.results, strict=False)
        if not r.ok
    ]
    if missing:
        return judged(
            p,
            Outcome.FAIL,
            f"missing {len(missing)} of {len(a.results)} rules: " + "; ".join(missing),
            SUDOERS_FIX.format(user=s.hosts[p.host].user),
        )
    return judged(p, Outcome.OK, f"all {len(a.results)} rules the bot needs are granted")


# The host-maintenance rules' check (bot.core.sudoers_host): its own, as a warning, since a
# host without them still serves; only host reboot and gpu-reset need them.
HOST_RULES = "host maintenance sudo rules"


def _host_rules(p: Probe, a: Answer, s: Settings) -> Check:
    """The host-maintenance rules (``bot.core.sudoers_host``): a warning at worst, as the
    host serves without them; only host reboot and gpu-reset need them."""
    fix = SUDOERS_FIX.format(user=s.hosts[p.host].user)
    if a.error:
        return judged(p, Outcome.WARN, f"not checked: {a.error}", fix)
    missing = []
    for g, r in zip(host_grants(s.maintenance), a.results, strict=False):
        if r.ok:
            continue
        why = sudo_refusal(r.exit_status, r.stderr) or ""
        gone = f"; {why}" if "does not exist" in why else ""
        missing.append(f"{host_alias(s.hosts[p.host].user)}: `{g.line()}` ({g.why}{gone})")
    if missing:
        return judged(
            p,
            Outcome.WARN,
            f"missing {len(missing)} of {len(a.results)} host-maintenance rules (the "
            "services run without them; a `host reboot` or `host gpu-reset` that needs "
            "one is refused at its preflight, before any service stops): " + "; ".join(missing),
            fix,
        )
    return judged(
        p, Outcome.OK, f"all {len(a.results)} host-maintenance rules (reboot, GPU reset) granted"
    )


JUDGES: dict[str, Callable[[Probe, Answer, Settings], Check]] = {
    "sudo -l": _sudo_list,
    "sudo PATH": _sudo_path,
    "sudo rules": _sudo_rules,
    HOST_RULES: _host_rules,
}
