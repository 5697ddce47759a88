"""``doctor``: what to check on each host and service, and what each answer means.

``probes`` lists the checks for the configured hosts and services (pure); the edge
(``bot.engine.doctor``) performs each one and hands back an ``Answer``; ``judge`` turns
that into a ``Check``: ok, warn or fail, with what to do about it.  Every probe only
reads: a TCP connect, the host key the server presents, ``id -un``, ``sudo -n -l``,
``uv --version``, ``nvidia-smi``, ``systemctl show``, ``test -x``, ``uv pip show``,
``df`` and a GET of the health URL through the SSH connection.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from bot.core import remote
from bot.core.gpu import check_nvidia_smi, driver_warnings, parse_gpu_csv
from bot.core.leftovers import unit_user_query
from bot.core.privilege import SH, Privilege
from bot.core.results import CommandResult, HttpResult
from bot.core.sudoers import Grant, alias, grants
from bot.errors import GpuQueryError
from bot.settings import HostSettings, ServiceSettings, Settings

Argv = tuple[str, ...]
HOST_TIMEOUT_S = 10.0
SUDOERS_FIX = ("install the output of `python -m bot sudoers --user {user}` on the host as "
               "/etc/sudoers.d/vllm-chatops (README: non-root hosts)")


class Outcome(StrEnum):
    OK = "ok"
    WARN = "warn"  # works, but the setup gives more than the bot needs
    FAIL = "fail"
    SKIP = "skip"  # not checked: a check it depends on failed


class Kind(StrEnum):
    CONFIG = "config"  # judged from the settings alone
    TCP = "tcp"
    HOST_KEY = "host key"
    COMMANDS = "commands"  # run ``commands`` on the host, in order
    HTTP = "http"


@dataclass(frozen=True, slots=True)
class Probe:
    host: str
    service: str | None
    name: str
    kind: Kind
    # (argv, the account it needs): run through the host's sudo prefix like the flows'.
    commands: tuple[tuple[Argv, Privilege], ...] = ()
    url: str = ""
    timeout_s: float = HOST_TIMEOUT_S
    # A failure here leaves the host's later checks unchecked (SKIP).
    gate: bool = False
    # What to run next, from what ``commands`` answered (pure; none: nothing more).
    then: Callable[[tuple[CommandResult, ...]], tuple[tuple[Argv, Privilege], ...]] | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the edge found. ``error``: it could not ask at all (the reason)."""

    error: str | None = None
    results: tuple[CommandResult, ...] = ()
    http: HttpResult | None = None
    key: str | None = None  # the SHA256 fingerprint the server presented
    trusted: str = ""  # what known_hosts trusts for the host (bot.hosts.known_hosts)


@dataclass(frozen=True, slots=True)
class Check:
    host: str
    service: str | None
    name: str
    outcome: Outcome
    detail: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "service": self.service, "check": self.name,
                "result": str(self.outcome), "detail": self.detail, "fix": self.fix}


def skipped(probe: Probe, because: str) -> Check:
    return Check(probe.host, probe.service, probe.name, Outcome.SKIP,
                 f"not checked: {because}")


# ---- what to check ---------------------------------------------------------------------


def _host_probes(name: str, cfg: HostSettings) -> list[Probe]:
    out = [Probe(name, None, "login account", Kind.CONFIG)]
    if not cfg.is_local:
        out += [Probe(name, None, "tcp", Kind.TCP, timeout_s=cfg.connect_timeout_s, gate=True),
                Probe(name, None, "host key", Kind.HOST_KEY, timeout_s=cfg.connect_timeout_s,
                      gate=True)]
    out.append(Probe(name, None, "ssh login", Kind.COMMANDS, ((("id", "-un"),
                                                               Privilege.NONE),), gate=True))
    if cfg.become == "sudo":
        out.append(Probe(name, None, "sudo -l", Kind.COMMANDS,
                         ((("sudo", "-n", "-l"), Privilege.NONE),)))
        out.append(Probe(name, None, "sudo PATH", Kind.COMMANDS,
                         ((("sudo", "-n", "-l"), Privilege.NONE),)))
    if not cfg.is_local and cfg.user != "root":
        out.append(Probe(name, None, "authorized_keys", Kind.COMMANDS,
                         (((SH, "-c", SSHD_KEYS_SCRIPT, "sh", cfg.sshd_config),
                           Privilege.NONE),), then=_check_key_files))
    out.append(Probe(name, None, "nvidia-smi", Kind.COMMANDS,
                     ((remote.gpu_query(), Privilege.NONE),)))
    return out


def _sudo_check(g: Grant, svc: ServiceSettings) -> Argv:
    who = ("-u", svc.venv_user) if g.run_as == Privilege.VENV_OWNER and svc.venv_user else ()
    return ("sudo", "-n", "-l", *who, "--", *g.sample)


def _owners(svc: ServiceSettings) -> Argv:
    """Who owns the venv and the bot's directory beside it (``<owner> <path>`` lines; a
    directory not made yet is left out, stat exits 1)."""
    return ("stat", "-c", "%U %n", "--", svc.venv_dir, remote.state_dir(svc))


def _service_probes(host: str, cfg: HostSettings, name: str, svc: ServiceSettings
                    ) -> list[Probe]:
    t = svc.command_timeout_s
    out = []
    if cfg.become == "sudo":
        out.append(Probe(host, name, "sudo rules", Kind.COMMANDS, tuple(
            (_sudo_check(g, svc), Privilege.NONE) for g in grants(svc)), timeout_s=t))
    out += [
        Probe(host, name, "uv", Kind.COMMANDS, (((svc.uv, "--version"), Privilege.NONE),),
              timeout_s=t),
        Probe(host, name, "unit", Kind.COMMANDS, ((remote.unit_show(svc), Privilege.ROOT),
                                                  (unit_user_query(svc.unit, svc.systemctl),
                                                   Privilege.NONE)), timeout_s=t),
        Probe(host, name, "venv", Kind.COMMANDS, ((("test", "-x", svc.python), Privilege.NONE),
                                                  (remote.package_show(svc), Privilege.VENV_OWNER),
                                                  (_owners(svc), Privilege.NONE)),
              timeout_s=t),
        Probe(host, name, "health", Kind.HTTP, url=svc.health_url, timeout_s=t),
        Probe(host, name, "disk", Kind.COMMANDS, ((remote.free_disk(svc), Privilege.NONE),),
              timeout_s=t),
    ]
    return out


def probes(settings: Settings, hosts: Sequence[str], service: str | None = None) -> list[Probe]:
    """The checks for ``hosts`` and the services on them (only ``service`` when given),
    host by host, each host's own checks first."""
    out: list[Probe] = []
    for host in hosts:
        cfg = settings.hosts[host]
        out += _host_probes(host, cfg)
        for name, svc in settings.services.items():
            if host in svc.hosts and service in (None, name):
                out += _service_probes(host, cfg, name, svc)
    return out


# ---- what the answers mean -------------------------------------------------------------


def _check(p: Probe, outcome: Outcome, detail: str, fix: str = "") -> Check:
    return Check(p.host, p.service, p.name, outcome, detail, fix)


def _said(r: CommandResult) -> str:
    if r.refused:
        return r.refused
    text = " ".join(r.output.strip().splitlines()[-2:])
    status = "no exit status" if r.exit_status is None else f"exit {r.exit_status}"
    return f"{status}: {text}" if text else status


def _failed(p: Probe, a: Answer) -> CommandResult | None:
    return next((r for r in a.results if not r.ok), None)


def _login_account(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    if cfg.is_local:
        return _check(p, Outcome.OK, "local: commands run as the bot's own account")
    if cfg.user == "root":
        return _check(p, Outcome.WARN, "logs in as root: whoever holds the bot's key owns "
                      "this host", "log in as an ordinary account with become = \"sudo\" "
                      "(README: non-root hosts)")
    how = ("sudo for what needs rights" if cfg.become == "sudo" else
           "no sudo: the account must own the unit and the venv")
    return _check(p, Outcome.OK, f"logs in as {cfg.user}, {how}")


def _tcp(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    if a.error:
        return _check(p, Outcome.FAIL, f"{cfg.address}:{cfg.port}: {a.error}",
                      f"check hosts.{p.host}.address and port, the network path, and that "
                      "sshd runs on the host")
    return _check(p, Outcome.OK, f"{cfg.address}:{cfg.port} accepts connections")


def _host_key(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    scan = (f"verify the key out of band, then add it: `ssh-keyscan -p {cfg.port} "
            f"{cfg.address} >> {cfg.known_hosts}` (compare `ssh-keygen -lf` with the host)")
    if a.error or a.key is None:
        return _check(p, Outcome.FAIL, f"no host key read: {a.error}", scan)
    trusted = [t for t in a.trusted.split(",") if t.startswith("SHA256:")]
    if a.trusted.startswith("cert-authority") and not trusted:
        return _check(p, Outcome.OK, f"{a.key}, signed by a trusted authority (checked at login)")
    if not trusted:
        return _check(p, Outcome.FAIL, f"{cfg.known_hosts} has no entry for "
                      f"[{cfg.address}]:{cfg.port} (the host presents {a.key})", scan)
    if a.key not in trusted:
        return _check(p, Outcome.FAIL, f"the host presents {a.key}, but {cfg.known_hosts} "
                      f"trusts {', '.join(trusted)}: changed, or not the host you meant",
                      "find out why the key changed before trusting the new one; then "
                      f"replace the entry (`ssh-keygen -R '[{cfg.address}]:{cfg.port}' -f "
                      f"{cfg.known_hosts}`, then add the verified key)")
    return _check(p, Outcome.OK, f"{a.key} matches {cfg.known_hosts}")


def _ssh_login(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        why = a.error or (_said(r) if r else "no answer")
        return _check(p, Outcome.FAIL, why, f"put the bot's public key ({cfg.key_file}.pub) "
                      f"in ~{cfg.user}/.ssh/authorized_keys on the host, restricted (README)")
    return _check(p, Outcome.OK, f"key accepted for {r.stdout.strip() or cfg.user}")


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
    return {("root" if g.run_as == Privilege.ROOT else svc.venv_user or "", g.line())
            for svc in s.services.values() for g in grants(svc)}


def _sudo_list(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        why = a.error or (_said(r) if r else "no answer")
        return _check(p, Outcome.FAIL, f"`sudo -n -l` failed: {why}",
                      SUDOERS_FIX.format(user=cfg.user))
    listed = parse_sudo_list(r.stdout)
    broad = [f"({who}) {cmd}" for who, cmd in listed if cmd == "ALL"]
    if broad:
        return _check(p, Outcome.WARN, f"{cfg.user} may run any command: {'; '.join(broad)}",
                      f"remove {cfg.user} from admin groups (sudo, wheel) and rules with ALL; "
                      "the bot needs only the rules `python -m bot sudoers` prints")
    extra = [f"({who}) {cmd}" for who, cmd in listed if (who, cmd) not in _ours(s)]
    if extra:
        return _check(p, Outcome.WARN, f"{len(extra)} rule(s) beyond what the bot needs: "
                      + "; ".join(extra), "remove them, or check they are meant for this account")
    return _check(p, Outcome.OK, f"{len(listed)} rules, none beyond what the bot needs")


# ---- whether sudo gives the bot's commands root's PATH (issue 17, F1) ----------------
# `sudo -n -l` lists the Defaults that apply to the account ("Matching Defaults entries":
# global, host and user ones, in order, the last of each option winning), then those
# bound to a run-as account (`Defaults>root`) or to commands (`Defaults!<commands>`),
# which sudo applies after them, each entry its bound list and then its options. Read
# from Debian 12's sudo 1.9.13p3 (tests/samples/sudo_l_*.txt): without a terminal an
# entry is one line; on one, sudo wraps it at a space onto lines 4 spaces in. In a
# command sudoers escapes "=" and "!", so an unescaped `secure_path=` or `!secure_path`
# there is an option, never part of a command.
_SECURE_PATH = re.compile(r"(?:^|[ ,])(?P<neg>!)?secure_path(?:=(?P<value>(?:\\.|[^,\s])*))?"
                          r"(?=,|\s|$)")


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
            bound.append(line.strip()[len("Defaults"):])
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
        return any(listed.startswith(line + sep) or f", {line}{sep}" in listed
                   for sep in (", ", " "))
    return False


def secure_path_for(listing: tuple[str, list[str]], runas: str, line: str) -> str | None:
    """The PATH sudo gives ``line`` (a rule as ``Grant.line`` writes it) run as
    ``runas``: a command's own Defaults, else its run-as account's, else the account's;
    None when none sets secure_path (sudo then keeps the caller's PATH)."""
    options, bound = listing
    for level in ("!", ">"):
        said = [_last_secure_path(e) for e in bound
                if e.startswith(level) and _bound_to(e, runas, line)]
        said = [x for x in said if x[0]]
        if said:
            return said[-1][1]
    return _last_secure_path(options)[1]


def _sudo_path(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        why = a.error or (_said(r) if r else "no answer")
        return _check(p, Outcome.FAIL, f"`sudo -n -l` failed: {why}",
                      SUDOERS_FIX.format(user=cfg.user))
    listing = parse_sudo_defaults(r.stdout)
    ours = [(alias(name, g.run_as), g, "root" if g.run_as == Privilege.ROOT else
             svc.venv_user or "") for name, svc in s.services.items() if p.host in svc.hosts
            for g in grants(svc)]
    bad: list[str] = []
    paths: set[str] = set()
    for name, g, runas in ours:
        path = secure_path_for(listing, runas, g.line())
        if path is None or not all(d.startswith("/") for d in path.split(":")):
            bad.append(f"{name}: `{g.line()[:80]}`" + ("" if path is None else f" ({path})"))
        else:
            paths.add(path)
    if bad:
        return _check(p, Outcome.FAIL, f"sudo keeps {cfg.user}'s own PATH (no secure_path, or "
                      f"one with a relative directory) for {len(bad)} of {len(ours)} rules, "
                      "so a command the bot runs by name there would be the one "
                      f"{cfg.user} puts first: " + "; ".join(bad[:3]),
                      SUDOERS_FIX.format(user=cfg.user) + ": its `Defaults!<alias> "
                      "env_reset, secure_path=...` lines give the rules root's PATH")
    return _check(p, Outcome.OK, f"secure_path applies to all {len(ours)} rules: "
                  + ", ".join(sorted(paths)))


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
    'case $1 in [Ii][Nn][Cc][Ll][Uu][Dd][Ee]) shift; for g do '
    'case $g in /*) ;; *) g=$base/$g;; esac; for f in $g; do [ -e "$f" ] && '
    'dump "$f" $((depth + 1)); done; done;; esac; done < "$file"; }; dump "$1" 0'
)
KEY_FILE_SCRIPT = (
    'for f do p=$f; v=locked; child=; while :; do '
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
        expanded = re.sub(r"%[%hUu]", lambda m: {"%%": "%", "%h": home, "%u": user,
                                                  "%U": uid}[m[0]], token)
        if "%" in expanded.replace("%%", ""):
            return KeyFiles(user, unknown=f"AuthorizedKeysFile {token}: a token doctor "
                            "cannot expand")
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


def _check_key_files(results: tuple[CommandResult, ...]) -> tuple[tuple[Argv, Privilege], ...]:
    found = key_files(results[0].stdout) if results else KeyFiles("")
    if found.unknown or not found.files:
        return ()
    return (((SH, "-c", KEY_FILE_SCRIPT, "sh", *found.files), Privilege.NONE),)


def _authorized_keys(p: Probe, a: Answer, s: Settings) -> Check:
    cfg = s.hosts[p.host]
    fix = ("make the file sshd reads the bot's key from root's: `AuthorizedKeysFile "
           "/etc/ssh/authorized_keys/%u` in sshd_config, that file root's, mode 0644, "
           f"holding the restricted entry (README: non-root hosts); sshd_config is read from "
           f"hosts.{p.host}.sshd_config")
    found = key_files(a.results[0].stdout) if a.results else KeyFiles("")
    if a.error or found.unknown:
        return _check(p, Outcome.WARN, f"cannot tell which file sshd reads {cfg.user}'s keys "
                      f"from ({a.error or found.unknown}), so not whether {cfg.user} can "
                      "change its own key's restrictions", fix)
    if not found.files:
        return _check(p, Outcome.OK, "sshd reads no authorized_keys file (AuthorizedKeysFile "
                      "none)")
    said = dict(line.split("\t", 1) for line in
                (a.results[1].stdout if len(a.results) > 1 else "").splitlines()
                if "\t" in line)
    open_to = [f"{f} ({said[f].replace('owned', 'it owns').replace('writable', 'it can write')})"
               if f in said else f"{f} (not checked)" for f in found.files
               if said.get(f, "?") != "locked"]
    if open_to:
        return _check(p, Outcome.WARN, f"{cfg.user} can change the file(s) sshd reads its keys "
                      f"from: {'; '.join(open_to)}. Code running as {cfg.user} could add a key "
                      "without restrict, from= or permitopen=", fix)
    return _check(p, Outcome.OK, f"sshd reads {cfg.user}'s keys from {', '.join(found.files)}: "
                  f"{cfg.user} cannot change them")


def _sudo_rules(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    svc = s.services[p.service]
    if a.error:
        return _check(p, Outcome.FAIL, a.error)
    missing = [f"{alias(p.service, g.run_as)}: `{g.line()}` ({g.why})"
               for g, r in zip(grants(svc), a.results, strict=False) if not r.ok]
    if missing:
        return _check(p, Outcome.FAIL, f"missing {len(missing)} of {len(a.results)} rules: "
                      + "; ".join(missing), SUDOERS_FIX.format(user=s.hosts[p.host].user))
    return _check(p, Outcome.OK, f"all {len(a.results)} rules the bot needs are granted")


def _uv(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    r = _failed(p, a) if a.results else None
    if a.error or r is not None or not a.results:
        return _check(p, Outcome.FAIL, a.error or (_said(r) if r else "no answer"),
                      f"install uv on the host, or set services.{p.service}.uv to its path")
    return _check(p, Outcome.OK, a.results[0].stdout.strip() or "uv answers")


def _nvidia_smi(p: Probe, a: Answer, s: Settings) -> Check:
    r = a.results[0] if a.results else None
    fix = "check the NVIDIA driver: `nvidia-smi` on the host must list the GPUs"
    if a.error or r is None:
        return _check(p, Outcome.FAIL, a.error or "no answer", fix)
    # The GPU query's own judge, as the runs use it: a corrupted infoROM's warning (exit 14
    # with good rows) is a warning here too, not a failure that a run would not see.
    try:
        check_nvidia_smi(p.host, r)
        gpus = parse_gpu_csv(p.host, r.stdout)
    except GpuQueryError as e:
        return _check(p, Outcome.FAIL, e.reason if r.ok else _said(r), fix)
    found = f"{len(gpus)} GPU(s)" + (f": {gpus[0].name}" if gpus else "")
    warnings = driver_warnings(r.stdout, r.stderr)
    if warnings:
        return _check(p, Outcome.WARN, f"{found}; " + "; ".join(w.line for w in warnings),
                      "the GPU's infoROM is corrupted: its ECC and health records may be "
                      "unreliable; plan an infoROM recovery or RMA with NVIDIA")
    return _check(p, Outcome.OK, found)


def _unit(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    svc = s.services[p.service]
    r = a.results[0] if a.results else None
    if a.error or r is None or not r.ok:
        return _check(p, Outcome.FAIL, a.error or (_said(r) if r else "no answer"),
                      "" if r is None or not r.refused else
                      SUDOERS_FIX.format(user=s.hosts[p.host].user))
    props = remote.parse_unit_show(r.stdout)
    if props.get("LoadState") != "loaded":
        return _check(p, Outcome.FAIL, f"{svc.unit}: LoadState={props.get('LoadState', '?')}",
                      f"check services.{p.service}.unit against `systemctl list-units "
                      "--all 'vllm*'` on the host")
    state = f"{svc.unit}: {props.get('ActiveState', '?')} ({props.get('SubState', '?')})"
    user = a.results[1].stdout.strip() if len(a.results) > 1 and a.results[1].ok else None
    if (s.hosts[p.host].become == "sudo" and svc.venv_user and user is not None
            and user in ("", "root")):
        # The venv's owner writes the code the unit runs: with the unit as root, the
        # owner's rules (and so the bot's key) reach root through the venv.
        return _check(p, Outcome.WARN, f"{state}, runs as root (no User=): {svc.venv_user} "
                      "writes the venv it runs, so the bot's key reaches root through it",
                      f"set User= in {svc.unit} to an account other than root (the venv's "
                      "owner may read it; it must not be an admin)")
    return _check(p, Outcome.OK, state + (f", runs as {user}" if user else ""))


def _venv(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    svc = s.services[p.service]
    if a.error or len(a.results) < 2:
        return _check(p, Outcome.FAIL, a.error or "no answer")
    exists, show = a.results[:2]
    if not exists.ok:
        return _check(p, Outcome.FAIL, f"no interpreter at {svc.python}",
                      f"set services.{p.service}.python to the venv's bin/python")
    version = remote.parse_package_version(show.stdout) if show.ok else None
    if version is None:
        return _check(p, Outcome.FAIL, f"{svc.package} is not installed in {svc.venv_dir} "
                      f"({_said(show)})", f"install {svc.package} into the venv once by hand")
    ok = f"{svc.python}: {svc.package} {version}"
    cfg = s.hosts[p.host]
    if cfg.user == "root" and cfg.become == "none" and not cfg.is_local:
        return _root_mode_owners(p, svc, a.results[2] if len(a.results) > 2 else None, ok)
    return _check(p, Outcome.OK, ok)


def _root_mode_owners(p: Probe, svc: ServiceSettings, r: CommandResult | None,
                      ok: str) -> Check:
    """As root, the bot starts the venv's interpreter (uv, the import gate) and writes
    beside it: a venv another account can write runs that account's code as root (a
    .pth file), and the snapshot is not written into a .chatops root does not own
    (issue 17, F8). Who owns them, when stat cannot say, is not known to be root."""
    owners: dict[str, str] = {}
    for line in (r.stdout if r else "").splitlines():
        owner, sep, path = line.partition(" ")
        if sep:
            owners[path] = owner
    venv_owner = owners.get(svc.venv_dir)
    others = [f"{owner} owns {path}" for path, owner in owners.items() if owner != "root"]
    if venv_owner is None or others:
        said = _said(r) if r else "no answer"
        why = "; ".join(others) or f"cannot tell who owns {svc.venv_dir} ({said})"
        return _check(p, Outcome.WARN, f"{ok}; the bot logs in as root and {why}: code that "
                      "account writes into the venv (a .pth file) runs as root whenever uv or "
                      "the import gate starts its interpreter, and the snapshot is not written "
                      "into a directory root does not own",
                      f"log in as an ordinary account with become = \"sudo\" and venv_user = "
                      f"\"{venv_owner or 'vllm'}\" (README: non-root hosts), or make root own "
                      f"{svc.venv_dir} and {remote.state_dir(svc)}")
    return _check(p, Outcome.OK, f"{ok}, owned by root")


def _health(p: Probe, a: Answer, s: Settings) -> Check:
    h = a.http
    if a.error or h is None or not h.ok:
        why = a.error or (h.error or f"HTTP {h.status}" if h else "no answer")
        return _check(p, Outcome.FAIL, f"{p.url}: {why}",
                      f"check services.{p.service}.health_url (fetched on the host), that "
                      "the service runs, and that the key's permitopen= in authorized_keys "
                      "names its host:port exactly")
    return _check(p, Outcome.OK, f"{p.url}: HTTP 200")


def _disk(p: Probe, a: Answer, s: Settings) -> Check:
    assert p.service is not None
    svc = s.services[p.service]
    r = a.results[0] if a.results else None
    avail = remote.parse_df_avail_mib(r.stdout) if r is not None and r.ok else None
    if a.error or avail is None:
        return _check(p, Outcome.FAIL, a.error or f"cannot read free space of {svc.venv_dir}"
                      + (f" ({_said(r)})" if r else ""))
    if avail < svc.min_free_disk_mib:
        return _check(p, Outcome.FAIL, f"{avail:,} MiB free on {svc.venv_dir}, below "
                      f"min_free_disk_mib ({svc.min_free_disk_mib:,})",
                      "free space on the venv's file system (uv's cache is a usual suspect)")
    return _check(p, Outcome.OK, f"{avail:,} MiB free (min {svc.min_free_disk_mib:,})")


_JUDGES: dict[str, Callable[[Probe, Answer, Settings], Check]] = {
    "login account": _login_account, "tcp": _tcp, "host key": _host_key,
    "ssh login": _ssh_login, "sudo -l": _sudo_list, "sudo PATH": _sudo_path,
    "authorized_keys": _authorized_keys,
    "nvidia-smi": _nvidia_smi,
    "sudo rules": _sudo_rules, "uv": _uv, "unit": _unit, "venv": _venv, "health": _health,
    "disk": _disk,
}


def judge(probe: Probe, answer: Answer, settings: Settings) -> Check:
    return _JUDGES[probe.name](probe, answer, settings)


def passed(checks: Sequence[Check]) -> bool:
    """Everything passed (a warning is no failure; a skip follows one)."""
    return all(c.outcome in (Outcome.OK, Outcome.WARN) for c in checks)


# ---- the report ------------------------------------------------------------------------


_MARK = {Outcome.OK: "ok", Outcome.WARN: "WARN", Outcome.FAIL: "FAIL", Outcome.SKIP: "skip"}


@dataclass
class _Table:
    rows: list[tuple[str, ...]] = field(default_factory=list)

    def text(self) -> str:
        widths = [max(len(r[i]) for r in self.rows) for i in range(4)]
        out = []
        for r in self.rows:
            out.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True))
                       + "  " + r[4])
            if len(r) > 5 and r[5]:
                out.append(" " * (sum(widths) + 8) + "  fix: " + r[5])
        return "\n".join(out).rstrip()


def render(checks: Sequence[Check]) -> str:
    """One table: host, service, check, result, detail (and the fix under a failure)."""
    t = _Table([("HOST", "SERVICE", "CHECK", "RESULT", "DETAIL")])
    for c in checks:
        t.rows.append((c.host, c.service or "-", c.name, _MARK[c.outcome], c.detail,
                       c.fix if c.outcome in (Outcome.FAIL, Outcome.WARN) else ""))
    fails = sum(c.outcome == Outcome.FAIL for c in checks)
    warns = sum(c.outcome == Outcome.WARN for c in checks)
    verdict = ("all checks passed" if passed(checks) and not warns else
               f"all checks passed, {warns} warning(s)" if passed(checks) else
               f"{fails} check(s) failed, {warns} warning(s)")
    return f"{t.text()}\n\n{verdict}"
