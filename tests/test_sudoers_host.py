"""The sudo rules of host maintenance (issue 23: host reboot, GPU reset): the rule text
``python -m bot sudoers`` prints, what each rule allows and refuses (as sudo decides:
``Grant.matches``), a refusal naming the rule, ``doctor``'s check of them, and the
config check of ``[maintenance]``'s paths on sudo hosts. Against the real sudo:
tests/test_nonroot.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.core.become import become_for
from bot.core.doctor import Answer, Kind, Outcome, Probe, judge, passed, probes
from bot.core.host_ops import persistence_argv, reboot_argv, reset_argv
from bot.core.host_plan import make_host_plan
from bot.core.privilege import Privilege
from bot.core.results import CommandResult
from bot.core.status import Action
from bot.core.sudoers import render
from bot.core.sudoers_host import host_alias, host_grants, host_rule_for, maintained_hosts
from bot.core.sudoers_rules import Wild
from bot.errors import ConfigError, InputError
from bot.settings import MaintenanceSettings, Settings, load_settings
from tests.test_sudoers import HOST, MAINT, SVC, settings

HOST_ALIAS = host_alias("chatops")

M = MaintenanceSettings(**MAINT)
SMI = "/usr/bin/nvidia-smi"
CTL = "/usr/bin/systemctl"
CHECK = "host maintenance sudo rules"


def test_the_rules_are_exactly_reboot_and_the_three_gpu_lines_by_digits() -> None:
    assert [g.line() for g in host_grants(M)] == [
        f"{CTL} reboot",
        f"{SMI} -i [0-9] -pm 0",
        f"{SMI} -i [1-9][0-9] -pm 0",
        f"{SMI} -i [0-9] -pm 1",
        f"{SMI} -i [1-9][0-9] -pm 1",
        f"{SMI} -r -i [0-9]",
        f"{SMI} -r -i [1-9][0-9]",
    ]
    for g in host_grants(M):
        assert g.run_as == Privilege.ROOT and "*" not in g.line(), g.line()
        assert all(set(p.glob) <= set("[]-0123456789") for p in g.pattern if isinstance(p, Wild))
        assert g.matches(g.sample), g.line()


@pytest.mark.parametrize("index", [0, 3, 9, 10, 15, 99])
def test_every_command_host_maintenance_runs_has_a_rule(index: int) -> None:
    for argv in (
        reboot_argv(M),
        persistence_argv(M, index, False),
        persistence_argv(M, index, True),
        reset_argv(M, index),
    ):
        grant = host_rule_for(argv, M)
        assert grant is not None, argv
        assert grant.run_as == Privilege.ROOT


@pytest.mark.parametrize(
    "argv",
    [
        (SMI, "-r", "-i", "0", "-q"),  # an extra argument after the index
        (SMI, "-r", "-i", "0;", "rm"),  # a shell's separator (sudo runs no shell anyway)
        (SMI, "-r", "-i", "0; rm"),
        (SMI, "-r", "-i", "0 -q"),  # one argument with a space: sudo joins them
        (SMI, "-r", "-i", "0", "--anything"),
        (SMI, "-r", "-i", "100"),  # three digits
        (SMI, "-r", "-i", "05"),
        (SMI, "-r", "-i", "-1"),
        (SMI, "-r", "-i", "a"),
        (SMI, "-r", "-i", "*"),
        (SMI, "-r", "-i", ""),
        (SMI, "-r"),  # every GPU
        (SMI, "-r", "--id=0"),
        (SMI, "-i", "0", "-r"),  # another order
        (SMI, "-i", "0", "-pm", "2"),
        (SMI, "-i", "0", "-pm", "1", "-q"),
        (SMI, "-i", "0", "-pm", "0", "-i", "1"),
        (SMI, "-pm", "0"),  # every GPU
        (SMI, "-i", "0", "-mig", "1"),
        (SMI, "-i", "0", "-lgc", "300"),
        (SMI, "-q"),
        ("nvidia-smi", "-r", "-i", "0"),  # by name: not the path the rule names
        ("/tmp/nvidia-smi", "-r", "-i", "0"),
        (CTL, "reboot", "--force"),
        (CTL, "reboot", "-ff"),
        (CTL, "poweroff"),
        (CTL, "--force", "reboot"),
        (CTL, "reboot", "now"),
        (CTL, "stop", "--", "sshd"),
        (CTL,),
    ],
)
def test_no_host_rule_allows_another_argument_option_or_program(argv: tuple[str, ...]) -> None:
    assert host_rule_for(argv, M) is None, argv
    assert not any(g.matches(argv) for g in host_grants(M)), argv


def test_sudoers_prints_one_host_maintenance_section_for_the_sudo_gpu_hosts() -> None:
    text = render(settings(), "chatops")
    assert "# ==== host maintenance: hosts gpu-node-1" in text
    assert f"Cmnd_Alias {HOST_ALIAS} = \\\n    {CTL} reboot, \\\n" in text
    for g in host_grants(M):
        assert g.line() in text
    assert f"chatops ALL = (root) NOPASSWD: {HOST_ALIAS}" in text
    assert f'Defaults!{HOST_ALIAS} env_reset, secure_path="/usr/sbin:/usr/bin:/sbin:/bin"' in text
    assert text.count(f"Cmnd_Alias {HOST_ALIAS} ") == 1
    # A rule left out (the tests of a missing rule) is left out of the alias.
    reset = f"{SMI} -r -i [0-9]"
    kept = render(settings(), "chatops", omit=[reset])
    assert reset not in kept and f"{SMI} -r -i [1-9][0-9]" in kept


def two_hosts(**second: Any) -> Settings:
    return Settings(
        hosts={"gpu-node-1": HOST, "gpu-node-2": {**HOST, **second}},
        services={"kimi-k25": {**SVC, "hosts": ["gpu-node-1", "gpu-node-2"]}},
        maintenance=MAINT,
        db_path=Path("/nonexistent/audit.db"),
    )


def test_only_sudo_hosts_that_serve_get_the_rules_and_the_check() -> None:
    both = two_hosts()
    assert maintained_hosts(both) == ["gpu-node-1", "gpu-node-2"]
    assert maintained_hosts(both, ["gpu-node-2"]) == ["gpu-node-2"]
    root = two_hosts(user="root", become="none")
    assert maintained_hosts(root) == ["gpu-node-1"]
    assert "host maintenance: hosts gpu-node-1\n" in render(root, "chatops")
    assert [p.host for p in probes(root, ["gpu-node-1", "gpu-node-2"]) if p.name == CHECK] == [
        "gpu-node-1"
    ]
    # A sudo host with no service (a router's) gets none.
    lone = Settings(hosts={"lb-1": HOST}, db_path=Path("/nonexistent/audit.db"))
    assert maintained_hosts(lone) == []
    assert [p for p in probes(lone, ["lb-1"]) if p.name == CHECK] == []


# ---- [maintenance]'s paths -------------------------------------------------------------


def test_a_sudo_gpu_host_needs_absolute_maintenance_paths(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    base = (
        '[hosts.h]\naddress = "10.0.0.1"\nuser = "chatops"\nbecome = "sudo"\n'
        'known_hosts = "/dev/null"\n[services.s]\nhosts = ["h"]\nunit = "u"\n'
        'python = "/opt/v/bin/python"\nuv = "/usr/bin/uv"\nsystemctl = "/usr/bin/systemctl"\n'
        'journalctl = "/usr/bin/journalctl"\n'
    )
    cfg.write_text(base)
    # It still loads (a sudo deployment that never reboots from chat keeps working), but
    # a host maintenance is refused naming the key, and sudoers prints no rule for it.
    s = load_settings(cfg)
    with pytest.raises(InputError, match=r"\[maintenance\] systemctl = 'systemctl': host h uses"):
        make_host_plan(s, Action.REBOOT, "h")
    assert "# ==== host maintenance: no rules printed: [maintenance] systemctl" in render(
        s, "chatops"
    )
    assert HOST_ALIAS not in render(s, "chatops")
    cfg.write_text(base + '[maintenance]\nsystemctl = "/usr/bin/systemctl"\n')
    with pytest.raises(InputError, match=r"command -v nvidia-smi"):
        make_host_plan(load_settings(cfg), Action.REBOOT, "h")
    cfg.write_text(
        base
        + '[maintenance]\nsystemctl = "/usr/bin/systemctl"\nnvidia_smi = "/usr/bin/nvidia-smi"\n'
    )
    s = load_settings(cfg)
    assert make_host_plan(s, Action.REBOOT, "h").action == Action.REBOOT
    assert HOST_ALIAS in render(s, "chatops")
    # Root hosts (become = "none") find them in PATH, as the sim's do.
    cfg.write_text(base.replace('become = "sudo"', 'become = "none"'))
    s = load_settings(cfg)
    assert s.maintenance.systemctl == "systemctl"
    assert make_host_plan(s, Action.REBOOT, "h").action == Action.REBOOT
    # A path sudoers would read as syntax is no path a rule can name: refused at load.
    cfg.write_text(
        base + '[maintenance]\nsystemctl = "/usr/bin/system ctl"\nnvidia_smi = "/usr/bin/x"\n'
    )
    with pytest.raises(ConfigError, match=r"maintenance\.systemctl"):
        load_settings(cfg)


# ---- a refusal names the rule ------------------------------------------------------------


def test_a_refused_reboot_or_reset_names_the_host_maintenance_rule() -> None:
    b = become_for(settings(), "gpu-node-1")  # a host's own command: no service
    assert b is not None
    refused = "sudo: a password is required\n"
    why = b.refused(reboot_argv(M), Privilege.ROOT, 1, refused)
    assert why is not None
    assert f"lacks the host-maintenance rule `{CTL} reboot` (Cmnd_Alias {HOST_ALIAS}" in why
    assert "python -m bot sudoers" in why
    why = b.refused(reset_argv(M, 12), Privilege.ROOT, 1, refused)
    assert why is not None and f"`{SMI} -r -i [1-9][0-9]`" in why and "reset one GPU" in why
    why = b.refused(persistence_argv(M, 3, True), Privilege.ROOT, 1, refused)
    assert why is not None and f"`{SMI} -i [0-9] -pm 1`" in why
    # A line no rule allows (a GPU past 99) says the drop-in must be generated again.
    why = b.refused(reset_argv(M, 100), Privilege.ROOT, 1, refused)
    assert why is not None and "No rule in `python -m bot sudoers` covers" in why
    # A service's own command still names the service's rule.
    svc = become_for(settings(), "gpu-node-1", "kimi-k25")
    assert svc is not None
    stop = ("/usr/bin/systemctl", "stop", "--no-pager", "--", "vllm-kimi-k25")
    why = svc.refused(stop, Privilege.ROOT, 1, refused)
    assert why is not None and "KIMI_K25_ROOT" in why and HOST_ALIAS not in why


# ---- doctor --------------------------------------------------------------------------------


def result(status: int = 0, stdout: str = "", stderr: str = "") -> CommandResult:
    return CommandResult(("x",), status, stdout, stderr, 0.0)


def test_doctor_asks_sudo_about_each_host_rule_and_warns_naming_the_missing_line() -> None:
    s = settings()
    [probe] = [p for p in probes(s, ["gpu-node-1"]) if p.name == CHECK]
    assert (probe.service, probe.kind) == (None, Kind.COMMANDS)
    assert probe.commands == tuple(
        (("sudo", "-n", "-l", "--", *g.sample), Privilege.NONE) for g in host_grants(M)
    )
    n = len(host_grants(M))
    ok = judge(probe, Answer(results=tuple(result() for _ in range(n))), s)
    assert ok.outcome == Outcome.OK and f"all {n} host-maintenance rules" in ok.detail
    # The one-digit reset rule missing (sudo -l exits 1 for a line it does not allow).
    reset = next(i for i, g in enumerate(host_grants(M)) if g.line() == f"{SMI} -r -i [0-9]")
    results = [result(1) if i == reset else result() for i in range(n)]
    warn = judge(probe, Answer(results=tuple(results)), s)
    assert warn.outcome == Outcome.WARN, warn
    assert f"missing 1 of {n} host-maintenance rules" in warn.detail
    assert f"{HOST_ALIAS}: `{SMI} -r -i [0-9]` (reset one GPU" in warn.detail
    assert "python -m bot sudoers --user chatops" in warn.fix
    assert passed([warn])  # the host still serves: no failure
    # A tool that is not where [maintenance] says: sudo says so, and so does the check.
    gone = [result(1, stderr=f"sudo: {SMI}: command not found\n") for _ in range(n)]
    missing = judge(probe, Answer(results=tuple(gone)), s)
    assert (
        missing.outcome == Outcome.WARN and f"{SMI} does not exist on this host" in missing.detail
    )
    unreached = judge(probe, Answer(error="connection refused"), s)
    assert unreached.outcome == Outcome.WARN and "connection refused" in unreached.detail


def test_doctor_counts_the_host_rules_among_what_the_bot_needs() -> None:
    s = settings()
    listing = Probe("gpu-node-1", None, "sudo -l", Kind.COMMANDS)
    lines = "".join(f"    (root) NOPASSWD: {g.line()}\n" for g in host_grants(M))
    text = "User chatops may run the following commands on h:\n" + lines
    check = judge(listing, Answer(results=(result(0, text),)), s)
    assert check.outcome == Outcome.OK, check
