"""Non-root hosts, the pure parts: which account each remote command needs, the sudo
prefix, the sudoers rules, and sudo's refusals read from its real words.

The refusal texts were captured from Debian 12's sudo 1.9.13p3 (bookworm, the package
.ci/run installs), run as `sudo -n ...` by an ordinary account with and without a rule;
tests/test_nonroot.py gets them from the live sudo again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from bot.cli.main import main
from bot.core import remote
from bot.core.become import Become, become
from bot.core.doctor import (
    KEY_FILE_SCRIPT,
    Answer,
    Kind,
    Outcome,
    Probe,
    judge,
    key_files,
    parse_sudo_defaults,
    parse_sudo_list,
    passed,
    probes,
    secure_path_for,
)
from bot.core.leftovers import SIGNAL_SCRIPT, signal_command, unit_user_query
from bot.core.privilege import SAFE_PRELUDE, Command, Privilege, run_as_of, sudo_refusal
from bot.core.sudoers import LOGS_MAX, alias, grants, render, rule_for
from bot.core.sudoers_rules import Wild
from bot.errors import ConfigError
from bot.hosts.base import CommandResult
from bot.settings import HostSettings, ServiceSettings, Settings, load_settings
from bot.slack import grammar

SVC: dict[str, Any] = {
    "hosts": ["gpu-node-1"],
    "unit": "vllm-kimi-k25",
    "python": "/opt/venvs/vllm/bin/python",
    "uv": "/usr/local/bin/uv",
    "systemctl": "/usr/bin/systemctl",
    "journalctl": "/usr/bin/journalctl",
    "venv_user": "vllm",
    "indexes": {"nightly": "https://user:tok3n@wheels.example.com/simple"},
}
HOST: dict[str, Any] = {
    "address": "10.0.0.5",
    "user": "chatops",
    "become": "sudo",
    "known_hosts": "/dev/null",
}


MAINT: dict[str, Any] = {"systemctl": "/usr/bin/systemctl", "nvidia_smi": "/usr/bin/nvidia-smi"}


def settings(**svc: Any) -> Settings:
    return Settings(
        hosts={"gpu-node-1": HOST},
        services={"kimi-k25": {**SVC, **svc}},
        maintenance=MAINT,
        db_path=Path("/nonexistent/audit.db"),
    )


def service(**overrides: Any) -> ServiceSettings:
    return settings(**overrides).services["kimi-k25"]


# ---- sudo's refusals (captured, see the module doc) ------------------------------------

CAPTURED = {
    # No rule matches and the account has no NOPASSWD rule for it: what -n says.
    "password": (1, "sudo: a password is required\n"),
    # The same with `Defaults:vcexp1 !authenticate` (sudo may then tell):
    "not allowed": (
        1,
        "Sorry, user vcexp1 is not allowed to execute '/usr/bin/true a c' as root on vm.\n",
    ),
    # sudo -n -u nosuchuser -- /usr/bin/id
    "unknown user": (
        1,
        "sudo: unknown user nosuchuser\nsudo: error initializing audit plugin sudoers_audit\n",
    ),
    # A rule for a path that does not exist on the host.
    "not found": (1, "sudo: /nonexist/x: command not found\n"),
    # No sudo at all: dash says so (exit 127).
    "no sudo": (127, "/bin/sh: 1: sudo: not found\n"),
}


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("password", "no NOPASSWD rule matches"),
        ("not allowed", "does not allow vcexp1 to run this command line as root"),
        ("unknown user", "the account nosuchuser does not exist"),
        ("not found", "/nonexist/x does not exist on this host"),
        ("no sudo", "sudo is not installed"),
    ],
)
def test_each_captured_refusal_is_recognised(case: str, expected: str) -> None:
    status, stderr = CAPTURED[case]
    why = sudo_refusal(status, stderr)
    assert why is not None and expected in why


def test_a_commands_own_failure_is_not_a_refusal() -> None:
    # systemctl is-active says "inactive" with exit 3; uv fails with exit 1 or 2.
    assert sudo_refusal(3, "") is None
    assert sudo_refusal(1, "error: Failed to download `vllm==9.9`\n") is None
    assert sudo_refusal(2, "sudo: a password is required\n") is None
    assert sudo_refusal(0, "") is None


# ---- which account each command needs --------------------------------------------------


def test_the_unit_and_its_journal_need_root_the_venv_its_owner_and_queries_nothing() -> None:
    svc = service()
    for argv in (
        remote.unit_show(svc),
        remote.unit_is_active(svc),
        remote.unit_stop(svc),
        remote.unit_start(svc),
        remote.journal_tail(svc, 10),
    ):
        assert run_as_of(argv) == Privilege.ROOT, argv
    for argv in (
        remote.install_dry_run(svc, "vllm", None),
        remote.install(svc, "vllm", None),
        remote.install(svc, "vllm==1.0", "https://x/simple"),
        remote.install_previous(svc, "1.0", None),
        remote.sync_lock(svc, "/x.txt", offline=True),
        # What runs the venv's interpreter, whose .pth files its owner writes
        # (issue 17, F2): as the owner too, never as the login.
        remote.package_show(svc),
        remote.freeze(svc),
        remote.import_gate(svc),
    ):
        assert run_as_of(argv) == Privilege.VENV_OWNER, argv
    for argv in (
        remote.free_disk(svc),
        remote.gpu_query(),
        remote.apps_query(),
        remote.workers_query(),
        remote.installs_query(svc),
    ):
        assert run_as_of(argv) == Privilege.NONE, argv


def test_a_command_equals_its_plain_argv() -> None:
    argv = Command(("systemctl", "stop", "--", "u"), Privilege.ROOT)
    assert argv == ("systemctl", "stop", "--", "u") and argv[:2] == ("systemctl", "stop")
    assert run_as_of(("systemctl", "stop")) == Privilege.NONE


# ---- the prefix ------------------------------------------------------------------------


def test_become_prefixes_sudo_only_where_the_host_says_so() -> None:
    s = settings()
    svc, host = s.services["kimi-k25"], s.hosts["gpu-node-1"]
    stop = remote.unit_stop(svc)
    assert become(stop, Privilege.ROOT, host, svc) == ("sudo", "-n", "--", *stop)
    install = remote.install(svc, "vllm==1.0", None)
    assert become(install, Privilege.VENV_OWNER, host, svc) == (
        "sudo",
        "-n",
        "-u",
        "vllm",
        "--",
        *install,
    )
    assert become(remote.gpu_query(), Privilege.NONE, host, svc) == remote.gpu_query()
    as_root = HostSettings(**{**HOST, "become": "none", "user": "root"})
    assert become(stop, Privilege.ROOT, as_root, svc) == stop
    # No venv owner: the login user installs itself.
    own = service(venv_user=None)
    assert become(install, Privilege.VENV_OWNER, host, own) == install


def test_the_index_stays_outside_sudo_and_off_the_argv() -> None:
    svc = service()
    url = svc.indexes["nightly"]
    argv = remote.install(svc, "vllm==1.0", url)
    wrapped = become(argv, run_as_of(argv), settings().hosts["gpu-node-1"], svc)
    n = len(remote.INDEX_FROM_STDIN)
    assert wrapped[:n] == remote.INDEX_FROM_STDIN
    assert wrapped[n : n + 5] == ("sudo", "-n", "-u", "vllm", "--")
    assert not any("tok3n" in a for a in wrapped)
    assert remote.shown(wrapped).startswith("UV_EXTRA_INDEX_URL=<index URL, on stdin> sudo ")


def test_a_refusal_names_the_rule_the_host_lacks() -> None:
    svc = service()
    b = Become("kimi-k25", settings().hosts["gpu-node-1"], svc)
    stop = remote.unit_stop(svc)
    why = b.refused(stop, Privilege.ROOT, 1, "sudo: a password is required\n")
    assert why is not None
    assert "/usr/bin/systemctl stop --no-pager -- vllm-kimi-k25" in why
    assert "KIMI_K25_ROOT" in why and "python -m bot sudoers" in why
    pinned = remote.install(svc, "vllm==0.16.0", None)
    why = b.refused(pinned, Privilege.VENV_OWNER, 1, "sudo: a password is required\n")
    assert why is not None and "vllm\\=\\=*" in why and "KIMI_K25_VENV" in why
    # The command ran and failed on its own: no refusal.
    assert b.refused(stop, Privilege.ROOT, 1, "Failed to stop: Unit not loaded\n") is None
    # A command that needs nothing never went through sudo.
    assert (
        b.refused(remote.gpu_query(), Privilege.NONE, 1, "sudo: a password is required\n") is None
    )


# ---- the rules -------------------------------------------------------------------------


def test_every_command_the_flows_run_under_sudo_has_a_rule() -> None:
    svc = service()
    for argv in (
        remote.unit_show(svc),
        remote.unit_is_active(svc),
        remote.unit_stop(svc),
        remote.unit_start(svc),
        remote.journal_tail(svc),
        remote.journal_tail(svc, 1),
        remote.journal_tail(svc, LOGS_MAX),
        remote.install_dry_run(svc, "vllm", None),
        remote.install_dry_run(svc, "vllm==0.16.0rc2.dev313+g662205d34", None),
        remote.install(svc, "vllm", None),
        remote.install(svc, "vllm==0.16.0", None),
        remote.install_previous(svc, "0.15.1", None),
        remote.save_lock(svc, remote.lock_path(svc, "ab" * 32)),
        remote.prefetch(svc, None),
        remote.sync_lock(svc, remote.lock_path(svc, "cd" * 32), offline=True),
        remote.sync_lock(svc, remote.lock_path(svc, "cd" * 32), offline=False),
        remote.journal_cursor(svc),
        remote.journal_follow(svc, None),
    ):
        assert rule_for(argv, svc) is not None, argv
    # Reading after a cursor would need a wildcard for root: no rule (see sudoers.py).
    cursor = "s=0b1c;i=1a2;b=9f8e;m=3c4d;t=5e6f;x=7a8b"
    assert rule_for(remote.journal_follow(svc, cursor), svc) is None
    for g in grants(svc):
        assert g.matches(g.sample), g.line()


@pytest.mark.parametrize(
    "argv",
    [
        ("/usr/bin/systemctl", "stop", "--", "sshd"),  # another unit
        ("/usr/bin/systemctl", "stop", "--", "vllm-kimi-k25", "sshd"),  # one more
        ("/usr/bin/systemctl", "--now", "stop", "--", "vllm-kimi-k25"),  # an option
        ("/usr/bin/systemctl", "edit", "--", "vllm-kimi-k25"),
        ("/usr/bin/journalctl", "-u", "vllm-kimi-k25", "-n", "1001", "--no-pager"),
        ("/usr/bin/journalctl", "-u", "vllm-kimi-k25", "-n", "0", "--no-pager"),
        ("/usr/bin/journalctl", "-u", "vllm-kimi-k25", "-n", "5", "-u", "sshd", "--no-pager"),
        ("/usr/bin/journalctl", "-u", "vllm-kimi-k25", "-n", "5", "--no-pager", "-o", "export"),
        ("/usr/local/bin/uv", "pip", "install", "--python", "/usr/bin/python3", "vllm"),
        ("/usr/local/bin/uv", "run", "sh"),
        ("/bin/sh", "-c", "id"),
    ],
)
def test_no_rule_allows_another_unit_option_or_command(argv: tuple[str, ...]) -> None:
    svc = service()
    assert not any(g.matches(argv) for g in grants(svc)), argv


def test_root_rules_have_no_wildcard_and_venv_rules_say_why_they_do() -> None:
    svc = service()
    text = render(settings(), "chatops")
    for g in grants(svc):
        assert g.line() in text
        wild = [p for p in g.pattern if isinstance(p, Wild)]
        if g.run_as == Privilege.ROOT and g.sample[:2] != ("/bin/sh", "-c"):
            # The unit's commands: no "*" anywhere, digits only for the journal's -n.
            assert all(set(p.glob) <= set("[]-0123456789") for p in wild), g.line()
        elif g.run_as == Privilege.ROOT:
            # The leftover signal: one "*", the last argument, after the fixed script.
            assert [p.glob for p in wild] == ["*"] and g.pattern[-1] == wild[0], g.line()
    assert "chatops ALL = (root) NOPASSWD: CHATOPS__KIMI_K25_ROOT" in text
    assert "chatops ALL = (vllm) NOPASSWD: CHATOPS__KIMI_K25_VENV" in text
    assert 'Defaults!CHATOPS__KIMI_K25_VENV env_keep += "UV_EXTRA_INDEX_URL"' in text
    assert "also matches spaces" in text  # the comment that explains the choice
    assert "tok3n" not in text and "wheels.example.com" not in text
    assert alias("chatops", "9-lives.a", Privilege.ROOT) == "CHATOPS__9_LIVES_A_ROOT"


def test_no_argument_of_a_rule_holds_a_run_of_spaces() -> None:
    # sudo compares a rule's arguments word by word: "a  b" in a rule is "a b", so an
    # argument with two spaces in a row (a script's `grep '^  -'`) never matches its own
    # rule, and real sudo asks for a password (tests/test_nonroot.py saw it).
    for g in grants(service()):
        for part in g.sample:
            assert "  " not in part and "\t" not in part and "\n" not in part, g.line()


def test_every_systemctl_and_journalctl_line_says_no_pager() -> None:
    # Issue 17, F10: systemd before 247 ran its pager (less, which runs a shell) as root
    # under sudo with a terminal (CVE-2023-26604). Every line the bot runs, and so every
    # rule, says --no-pager before the unit.
    svc = service()
    built = [
        remote.unit_show(svc),
        remote.unit_is_active(svc),
        remote.unit_stop(svc),
        remote.unit_start(svc),
        remote.journal_tail(svc, 5),
        remote.journal_cursor(svc),
        remote.journal_follow(svc, None),
        remote.journal_follow(svc, "s=1;i=2"),
        unit_user_query(svc.unit, svc.systemctl),
    ]
    built += [g.sample for g in grants(svc) if g.sample[0] in (svc.systemctl, svc.journalctl)]
    assert len(built) > 9
    for argv in built:
        ends = argv.index("--") if "--" in argv else len(argv)
        assert "--no-pager" in argv[:ends], argv
    # And the systemctl the leftover script runs itself.
    assert '"$systemctl" show -p User --value --no-pager -- "$unit"' in SIGNAL_SCRIPT


def test_what_runs_with_rights_finds_nothing_through_path() -> None:
    # Issue 17, F1: every script run as root or as the venv's owner names /bin/sh and
    # fixes PATH first; the leftover script runs ps and kill by the absolute paths the
    # rule fixes; and each group of rules gets root's PATH from its own Defaults line.
    svc = service(ps="/bin/ps", kill="/bin/kill")
    lock = remote.lock_path(svc, "ab" * 32)
    for argv in (
        remote.save_lock(svc, lock),
        remote.prefetch(svc, None),
        signal_command("TERM", [], svc.unit, svc.systemctl, ps=svc.ps, kill=svc.kill),
    ):
        assert argv[:2] == ("/bin/sh", "-c") and SAFE_PRELUDE in argv[2], argv[:2]
        # Before it, only the shell's own builtins (the prefetch finds uv's path).
        before = argv[2].split(SAFE_PRELUDE)[0]
        assert before in (
            "",
            'uv=$(command -v -- "$2") || { echo "$2: not found" >&2; exit 127; }; ',
        ), before
    kill = next(g for g in grants(svc) if "KILL" in g.sample)
    assert kill.sample[4:7] == (svc.systemctl, "/bin/ps", "/bin/kill")
    text = render(settings(), "chatops")
    for name in ("CHATOPS__KIMI_K25_ROOT", "CHATOPS__KIMI_K25_VENV"):
        assert f'Defaults!{name} env_reset, secure_path="/usr/sbin:/usr/bin:/sbin:/bin"' in text
    # A tool root runs must be named by its absolute path, on any host.
    with pytest.raises(ValidationError, match="absolute"):
        service(ps="ps")


def test_a_missing_venv_owner_means_no_venv_rules() -> None:
    text = render(settings(venv_user=None), "chatops")
    assert "KIMI_K25_VENV" not in text and "must own that venv" in text


@pytest.mark.skipif(
    shutil.which("visudo") is None, reason="visudo is not installed (apt-get install sudo)"
)
def test_visudo_accepts_the_rules(tmp_path: Path) -> None:
    path = tmp_path / "rules"
    path.write_text(render(settings(package="vllm[audio]"), "chatops"))
    r = subprocess.run(
        ["visudo", "-c", "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_logs_max_matches_the_grammar() -> None:
    assert grammar.LOGS_MAX == LOGS_MAX


# ---- settings ----------------------------------------------------------------------------


def test_sudo_hosts_need_absolute_tool_paths(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        '[hosts.h]\naddress = "10.0.0.1"\nuser = "chatops"\nbecome = "sudo"\n'
        'known_hosts = "/dev/null"\n[services.s]\nhosts = ["h"]\nunit = "u"\n'
        'python = "/opt/v/bin/python"\nuv = "/usr/bin/uv"\n'
    )
    with pytest.raises(ConfigError, match=r"services\.s\.systemctl = 'systemctl'"):
        load_settings(cfg)
    cfg.write_text(cfg.read_text().replace('become = "sudo"', 'become = "none"'))
    assert load_settings(cfg).hosts["h"].become == "none"
    cfg.write_text(cfg.read_text().replace('become = "none"', 'become = "doas"'))
    with pytest.raises(ConfigError, match=r"hosts\.h\.become"):
        load_settings(cfg)


# ---- doctor's reading of `sudo -n -l` ------------------------------------------------------

# `sudo -n -l` by vcexp1 on Debian 12's sudo 1.9.13p3, with rules naming a Cmnd_Alias, an
# escaped comma, a long command sudo wrapped, another run-as account and one rule without
# NOPASSWD (see the module doc).
SUDO_LIST = """\
Matching Defaults entries for vcexp1 on vm:
    env_reset, mail_badpass,
    secure_path=/usr/local/sbin\\:/usr/local/bin\\:/usr/sbin\\:/usr/bin\\:/sbin\\:/bin,
    use_pty

User vcexp1 may run the following commands on vm:
    (root) NOPASSWD: /usr/bin/true a b, /usr/bin/echo x\\,y -- z, /usr/bin/echo
        ^hello [0-9]+$
    (vcexp2) NOPASSWD: /usr/bin/id
    (root) /usr/bin/false
"""


def test_sudo_list_is_read_entry_by_entry() -> None:
    assert parse_sudo_list(SUDO_LIST) == [
        ("root", "/usr/bin/true a b"),
        ("root", "/usr/bin/echo x\\,y -- z"),
        ("root", "/usr/bin/echo ^hello [0-9]+$"),
        ("vcexp2", "/usr/bin/id"),
        ("root", "/usr/bin/false"),
    ]
    # What an account in the sudo group gets on Debian (`%sudo ALL=(ALL:ALL) ALL`).
    admin = "User chatops may run the following commands on gpu-node-1:\n    (ALL : ALL) ALL\n"
    assert parse_sudo_list(admin) == [("ALL : ALL", "ALL")]


def test_doctor_judges_the_listing_and_the_rules() -> None:
    s = settings()
    svc = s.services["kimi-k25"]
    listing = Probe("gpu-node-1", None, "sudo -l", Kind.COMMANDS)
    ours = "User chatops may run the following commands on h:\n" + "".join(
        f"    ({'root' if g.run_as == Privilege.ROOT else 'vllm'}) NOPASSWD: {g.line()}\n"
        for g in grants(svc)
    )
    assert judge(listing, answer(ours), s).outcome == Outcome.OK
    broad = judge(listing, answer(ours + "    (ALL : ALL) ALL\n"), s)
    assert broad.outcome == Outcome.WARN and "may run any command" in broad.detail
    extra = judge(listing, answer(ours + "    (root) NOPASSWD: /usr/bin/vim\n"), s)
    assert extra.outcome == Outcome.WARN and "/usr/bin/vim" in extra.detail
    no_rules = judge(listing, answer("", 1, "sudo: a password is required\n"), s)
    assert no_rules.outcome == Outcome.FAIL and "python -m bot sudoers" in no_rules.fix

    rules = Probe("gpu-node-1", "kimi-k25", "sudo rules", Kind.COMMANDS)
    stop = next(i for i, g in enumerate(grants(svc)) if "stop" in g.sample)
    results = [
        result("") if i != stop else result("", 1, "sudo: a password is required\n")
        for i in range(len(grants(svc)))
    ]
    check = judge(rules, Answer(results=tuple(results)), s)
    assert check.outcome == Outcome.FAIL
    assert "KIMI_K25_ROOT: `/usr/bin/systemctl stop --no-pager -- vllm-kimi-k25`" in check.detail
    assert passed([check]) is False


# `sudo -n -l` by vcexpA on Debian 12's sudo 1.9.13p3, captured here with the drop-in
# `python -m bot sudoers` printed for settings() (tests/samples/SOURCES.md, "privilege").
SAMPLES = Path(__file__).parent / "samples"


@pytest.mark.parametrize(
    ("sample", "expected"),
    [
        # The drop-in's own Defaults!<alias> lines, over `Defaults:vcexpA !secure_path`,
        # without a terminal (as over SSH) and with one (sudo wraps each entry)...
        ("sudo_l_command_defaults.txt", "/usr/sbin:/usr/bin:/sbin:/bin"),
        ("sudo_l_command_defaults_tty.txt", "/usr/sbin:/usr/bin:/sbin:/bin"),
        # ...an older drop-in without them on a host with Debian's own secure_path (good,
        # though unusual: the host's Defaults do it)...
        (
            "sudo_l_host_secure_path.txt",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        # ...and the same drop-in where the login's PATH is kept: nothing sets it.
        ("sudo_l_without_secure_path.txt", None),
    ],
)
def test_doctor_reads_the_path_sudo_gives_each_rule(sample: str, expected: str | None) -> None:
    text = (SAMPLES / sample).read_text()
    listing = parse_sudo_defaults(text)
    rules = parse_sudo_list(text)
    assert len(rules) == 24
    assert {secure_path_for(listing, who, line) for who, line in rules} == {expected}
    # A rule no Defaults entry names falls back to the account's own Defaults.
    assert secure_path_for(listing, "root", "/usr/bin/true") == (
        None if "command_defaults" in sample else expected
    )


def test_doctor_fails_unless_sudo_gives_the_rules_roots_path() -> None:
    s = settings()
    probe = Probe("gpu-node-1", None, "sudo PATH", Kind.COMMANDS)
    # The host's own secure_path covers every rule (an older drop-in): ok.
    host_wide = (SAMPLES / "sudo_l_host_secure_path.txt").read_text()
    ok = judge(probe, answer(host_wide), s)
    assert ok.outcome == Outcome.OK and "/usr/local/sbin" in ok.detail
    # Kept PATH, an unreadable listing, or a listing with no Defaults at all: fail.
    for text in (
        (SAMPLES / "sudo_l_without_secure_path.txt").read_text(),
        "",
        "User chatops may run the following commands on h:\n    (root) ALL\n",
    ):
        bad = judge(probe, answer(text), s)
        assert bad.outcome == Outcome.FAIL, text[:80]
        assert "sudo keeps chatops's own PATH" in bad.detail
        assert "secure_path" in bad.fix
    relative = host_wide.replace("secure_path=/usr/local/sbin", "secure_path=bin\\:/usr/local/sbin")
    assert judge(probe, answer(relative), s).outcome == Outcome.FAIL
    refused = judge(probe, answer("", 1, "sudo: a password is required\n"), s)
    assert refused.outcome == Outcome.FAIL and "python -m bot sudoers" in refused.fix


def test_doctor_warns_when_the_unit_runs_as_root_and_the_venv_owner_writes_its_code() -> None:
    # The venv owner's rules let the key write the venv; a unit running as root then
    # runs that code as root. The unit's User= decides what the key can reach.
    s = settings()
    unit = Probe("gpu-node-1", "kimi-k25", "unit", Kind.COMMANDS)
    show = result("LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=4242\n")
    as_vllm = judge(unit, Answer(results=(show, result("vllm\n"))), s)
    assert (as_vllm.outcome, as_vllm.detail) == (
        Outcome.OK,
        "vllm-kimi-k25: active (running), runs as vllm",
    )
    as_root = judge(unit, Answer(results=(show, result("\n"))), s)  # no User=: root
    assert as_root.outcome == Outcome.WARN and "reaches root" in as_root.detail
    assert "User=" in as_root.fix
    # Without a venv owner the key writes the venv itself: nothing more to warn about here.
    alone = judge(unit, Answer(results=(show, result("\n"))), settings(venv_user=None))
    assert alone.outcome == Outcome.OK


def test_doctor_warns_in_root_mode_when_another_account_owns_the_venv() -> None:
    # Issue 17, F8: as root the bot starts the venv's interpreter and writes beside it;
    # what another account writes there (a .pth file) would run as root.
    svc = dict(SVC, uv="uv", systemctl="systemctl", journalctl="journalctl")
    root = Settings(
        hosts={"gpu-node-1": {**HOST, "user": "root", "become": "none"}},
        services={"kimi-k25": svc},
        db_path=Path("/nonexistent"),
    )
    venv = Probe("gpu-node-1", "kimi-k25", "venv", Kind.COMMANDS)
    shown = result("Name: vllm\nVersion: 0.16.0\n")

    def owners(stdout: str, status: int = 0, stderr: str = "") -> Answer:
        return Answer(results=(result(""), shown, result(stdout, status, stderr)))

    ok = judge(venv, owners("root /opt/venvs/vllm\nroot /opt/venvs/.chatops\n"), root)
    assert ok.outcome == Outcome.OK and ok.detail.endswith("owned by root")
    # .chatops not made yet (stat exits 1 for it): nothing another account owns.
    fresh = owners(
        "root /opt/venvs/vllm\n",
        1,
        "stat: cannot statx '/opt/venvs/.chatops': No such file or directory\n",
    )
    assert judge(venv, fresh, root).outcome == Outcome.OK
    theirs = judge(venv, owners("vllm /opt/venvs/vllm\nvllm /opt/venvs/.chatops\n"), root)
    assert theirs.outcome == Outcome.WARN and "vllm owns /opt/venvs/vllm" in theirs.detail
    assert "runs as root" in theirs.detail and 'become = "sudo"' in theirs.fix
    # Who owns it unknown: not taken for root.
    unknown = judge(venv, owners("", 1, "stat: Permission denied\n"), root)
    assert unknown.outcome == Outcome.WARN and "cannot tell who owns" in unknown.detail
    # The same venv owner on a sudo host is the README's own layout.
    sudo = judge(venv, owners("vllm /opt/venvs/vllm\nvllm /opt/venvs/.chatops\n"), settings())
    assert sudo.outcome == Outcome.OK


# What SSHD_KEYS_SCRIPT prints: "user uid home", then sshd_config with its Include files
# in place. The directives' shapes are Debian 12's sshd_config (OpenSSH 9.2p1: the
# commented default, an Include of sshd_config.d) and sshd_config(5)'s tokens.
IDENT = "chatops 998 /home/chatops\n"
DEBIAN = (
    "Include /etc/ssh/sshd_config.d/*.conf\n#AuthorizedKeysFile\t.ssh/authorized_keys "
    ".ssh/authorized_keys2\nKbdInteractiveAuthentication no\nUsePAM yes\n"
)


@pytest.mark.parametrize(
    ("config", "files"),
    [
        (DEBIAN, ("/home/chatops/.ssh/authorized_keys", "/home/chatops/.ssh/authorized_keys2")),
        (
            "AuthorizedKeysFile /etc/ssh/authorized_keys/%u\n" + DEBIAN,
            ("/etc/ssh/authorized_keys/chatops",),
        ),
        # The README's way: a Match block for the login overrides the global default.
        (
            DEBIAN + "Match User chatops\n    AuthorizedKeysFile /etc/ssh/authorized_keys/%u\n",
            ("/etc/ssh/authorized_keys/chatops",),
        ),
        (
            DEBIAN + "Match User alice,bob\n    AuthorizedKeysFile /etc/ssh/authorized_keys/%u\n"
            "Match User *,!chatops\n    AuthorizedKeysFile /x/%u\n",
            ("/home/chatops/.ssh/authorized_keys", "/home/chatops/.ssh/authorized_keys2"),
        ),
        # The first one sshd reads wins; one under a Match that depends on more than the
        # user may apply too, so it counts.
        (
            "AuthorizedKeysFile=/etc/ssh/keys/%U %h/.ssh/extra\nAuthorizedKeysFile .ssh/x\n"
            'Match Address 10.1.230.10\n    AuthorizedKeysFile "/srv/keys/%u"\n',
            ("/etc/ssh/keys/998", "/home/chatops/.ssh/extra", "/srv/keys/chatops"),
        ),
        ("authorizedkeysfile none\n", ()),
    ],
)
def test_doctor_knows_which_files_sshd_reads_the_keys_from(
    config: str, files: tuple[str, ...]
) -> None:
    found = key_files(IDENT + config)
    assert (found.user, found.files, found.unknown) == ("chatops", files, None)


def test_what_doctor_cannot_tell_about_authorized_keys_is_not_safe() -> None:
    s = settings()
    probe = Probe("gpu-node-1", None, "authorized_keys", Kind.COMMANDS)
    for text in (
        "",
        IDENT + "#chatops-unreadable /etc/ssh/sshd_config.d/x.conf\n",
        IDENT + "AuthorizedKeysFile /keys/%k\n",
    ):
        assert key_files(text).unknown is not None
        check = judge(probe, answer(text), s)
        assert check.outcome == Outcome.WARN and "cannot tell" in check.detail, text
    # Root's own file, in root's directories: ok. The login's own: a warning.
    root_file = IDENT + "AuthorizedKeysFile /etc/ssh/authorized_keys/%u\n"
    locked = result("/etc/ssh/authorized_keys/chatops\tlocked\n")
    ok = judge(probe, Answer(results=(result(root_file), locked)), s)
    assert ok.outcome == Outcome.OK and "cannot change them" in ok.detail
    own = result(
        "/home/chatops/.ssh/authorized_keys\towned /home/chatops/.ssh\n"
        "/home/chatops/.ssh/authorized_keys2\twritable /home/chatops/.ssh\n"
    )
    warn = judge(probe, Answer(results=(result(IDENT + DEBIAN), own)), s)
    assert warn.outcome == Outcome.WARN and "it owns /home/chatops/.ssh" in warn.detail
    assert "AuthorizedKeysFile /etc/ssh/authorized_keys/%u" in warn.fix
    # A file the second read did not answer for is not taken as locked.
    unread = judge(probe, Answer(results=(result(root_file),)), s)
    assert unread.outcome == Outcome.WARN and "not checked" in unread.detail


def test_the_key_file_check_reads_real_permissions() -> None:
    # KEY_FILE_SCRIPT run for real as an ordinary account (nobody): a root file in root's
    # directories, a directory of its own, and a sticky world-writable one (a root file
    # there cannot be replaced by another account, a new name can be added).
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root to run the check as another account")
    base = Path(tempfile.mkdtemp(prefix="chatops-keys-", dir="/tmp"))
    try:
        base.chmod(0o755)
        (base / "root").mkdir(mode=0o755)
        (base / "root" / "keys").write_text("x\n")
        (base / "own").mkdir()
        shutil.chown(base / "own", "nobody")
        (base / "sticky").mkdir()
        (base / "sticky").chmod(0o1777)
        (base / "sticky" / "keys").write_text("x\n")
        paths = [
            str(base / "root" / "keys"),
            str(base / "sticky" / "keys"),
            str(base / "sticky" / "missing"),
            str(base / "own" / "keys"),
        ]
        r = subprocess.run(
            ["runuser", "-u", "nobody", "--", "/bin/sh", "-c", KEY_FILE_SCRIPT, "sh", *paths],
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        shutil.rmtree(base)
    said = dict(line.split("\t") for line in r.stdout.splitlines())
    assert [said[p] for p in paths] == [
        "locked",
        "locked",
        f"writable {base}/sticky",
        f"owned {base}/own",
    ], said


def result(stdout: str, status: int = 0, stderr: str = "") -> CommandResult:
    return CommandResult(
        argv=("x",), exit_status=status, stdout=stdout, stderr=stderr, duration_s=0.0
    )


def answer(stdout: str, status: int = 0, stderr: str = "") -> Answer:
    return Answer(results=(result(stdout, status, stderr),))


def test_doctor_checks_every_host_then_its_services(tmp_path: Path) -> None:
    s = settings()
    names = [(p.service, p.name) for p in probes(s, ["gpu-node-1"])]
    assert names == [
        (None, "login account"),
        (None, "tcp"),
        (None, "host key"),
        (None, "ssh login"),
        (None, "sudo -l"),
        (None, "sudo PATH"),
        (None, "authorized_keys"),
        (None, "nvidia-smi"),
        (None, "host maintenance sudo rules"),
        ("kimi-k25", "sudo rules"),
        ("kimi-k25", "uv"),
        ("kimi-k25", "unit"),
        ("kimi-k25", "unit command"),
        ("kimi-k25", "venv"),
        ("kimi-k25", "health"),
        ("kimi-k25", "disk"),
    ]
    # Only reading commands: nothing that stops, starts, installs or writes.
    for p in probes(s, ["gpu-node-1"]):
        for argv, _ in p.commands:
            text = " ".join(argv)
            assert not any(
                w in argv for w in ("stop", "start", "install", "sync")
            ) or text.startswith("sudo -n -l"), text
    root = Settings(
        hosts={"h": {**HOST, "user": "root", "become": "none"}}, db_path=Path("/nonexistent")
    )
    login = judge(Probe("h", None, "login account", Kind.CONFIG), Answer(), root)
    assert login.outcome == Outcome.WARN and "owns this host" in login.detail


def test_doctor_says_whether_the_units_flags_can_be_checked() -> None:
    # Issue 20: a real ExecStart that is no `vllm serve` (systemd#16051's logind, in
    # tests/samples/) is a warning, never a pass; a `vllm serve` unit passes.
    s = settings()
    p = Probe("gpu-node-1", "kimi-k25", "unit command", Kind.COMMANDS)
    logind = (Path(__file__).parent / "samples/systemctl_show_execstart_16051.txt").read_text()
    wrapper = judge(p, answer(logind), s)
    assert wrapper.outcome == Outcome.WARN
    assert "flags not checkable: the unit does not start `vllm serve` directly" in wrapper.detail
    serve = (
        "ExecStart={ path=/opt/venvs/vllm/bin/vllm ; argv[]=/opt/venvs/vllm/bin/vllm serve m "
        "--port 8000 -tp 8 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; "
        "code=(null) ; status=0/0 }\n"
    )
    ok = judge(p, answer(serve), s)
    assert ok.outcome == Outcome.OK and "`vllm serve` with 2 flags" in ok.detail
    unread = judge(p, answer("", 1, "Failed to connect to bus\n"), s)
    assert unread.outcome == Outcome.WARN and "cannot read the unit's ExecStart" in unread.detail
    # Side by side: the unit must start vLLM through the venv's link, or a switch changes
    # nothing it runs.
    side = s.model_copy(
        update={
            "services": {
                "kimi-k25": s.services["kimi-k25"].model_copy(update={"strategy": "side_by_side"})
            }
        }
    )
    assert judge(p, answer(serve), side).outcome == Outcome.OK  # /opt/venvs/vllm is the link
    pinned = serve.replace("/opt/venvs/vllm/bin", "/opt/venvs/vllm.releases/0.16.0-ab/bin")
    direct = judge(p, answer(pinned), side)
    assert direct.outcome == Outcome.FAIL and "not through /opt/venvs/vllm" in direct.detail
    assert "cannot be told either" in judge(p, answer(logind), side).detail


def test_doctor_reads_the_gpu_query_as_the_runs_do() -> None:
    """A corrupted infoROM (issue 17 D11): nvidia-smi exits 14 with its rows good and the
    warning on stderr (the line as NVIDIA/DCGM issue #2 quotes it, our own address). The
    runs read the rows and warn; doctor must not call the host broken. Any other failure,
    or garbage among the rows, still fails."""
    s = settings()
    probe = Probe("gpu-node-1", None, "nvidia-smi", Kind.COMMANDS)
    row = "0, GPU-0f0e0d0c-0b0a-0908-0706-050403020100, NVIDIA H200, 143771, 0, 143771\n"
    warned = judge(probe, answer(row, 14, "WARNING: infoROM is corrupted at gpu 0000:67:00.0\n"), s)
    assert warned.outcome == Outcome.WARN, warned
    assert "1 GPU(s): NVIDIA H200" in warned.detail and "infoROM" in warned.detail
    assert judge(probe, answer(row), s).outcome == Outcome.OK
    lost = judge(
        probe,
        answer(
            "", 15, "Unable to determine the device handle for GPU 0000:67:00.0: GPU is lost.\n"
        ),
        s,
    )
    assert lost.outcome == Outcome.FAIL and "15" in lost.detail, lost
    garbage = judge(probe, answer(row + "no such thing\n"), s)
    assert garbage.outcome == Outcome.FAIL, garbage
    bare14 = judge(probe, answer(row, 14), s)
    assert bare14.outcome == Outcome.FAIL, bare14


# ---- the command line --------------------------------------------------------------------


def test_sudoers_command_prints_the_rules_and_refuses_without_sudo_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "chatops.toml"
    cfg.write_text((Path(__file__).parents[1] / "deploy" / "chatops.example.toml").read_text())
    assert main(["sudoers", "--config", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "chatops ALL = (root) NOPASSWD: CHATOPS__KIMI_K25_ROOT" in out
    assert "/usr/bin/systemctl stop --no-pager -- vllm-kimi-k25" in out
    assert main(["sudoers", "--config", str(cfg), "--user", "bot2"]) == 0
    assert "bot2 ALL = (vllm) NOPASSWD: BOT2__KIMI_K25_VENV" in capsys.readouterr().out
    cfg.write_text(cfg.read_text().replace('become = "sudo"', 'become = "none"'))
    assert main(["sudoers", "--config", str(cfg)]) == 2
    assert "nothing needs rules" in capsys.readouterr().err
