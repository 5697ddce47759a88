"""Two logins' drop-ins on one host: alias names are global to everything sudo reads.

With the same service (or the host-maintenance rules) in two drop-ins, both used to define
``KIMI_K25_ROOT`` and ``HOST_MAINT_ROOT``: sudo warned ``Alias "KIMI_K25_ROOT" already
defined`` for the second file, kept the first definition, and bound the second login's
rule to the first file's commands (tests/samples/sudo_l_alias_already_defined*.txt:
``vcexpb`` may run ``vllm-kimi-k25``'s commands, not its own ``vllm-kimi-b``'s). Each
alias name now starts with its login, ``python -m bot sudoers`` refuses two groups of one
drop-in that would share a name, and ``doctor`` fails where sudo still warns."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.core.doctor import Answer, Kind, Outcome, Probe, judge
from bot.core.doctor_sudo import duplicate_aliases
from bot.core.privilege import Privilege
from bot.core.results import CommandResult
from bot.core.sudoers import alias, render
from bot.core.sudoers_host import host_alias
from bot.errors import ConfigError
from bot.settings import Settings
from tests.support.nonroot import (
    accounts,
    drop_ins_installed,
    require_root_and_sudo,
    workspace,
)

SAMPLES = Path(__file__).parent / "samples"


def settings(user: str, unit: str, service: str = "kimi-k25") -> Settings:
    """One deployment's config: ``user`` logs in to gpu-node-1 and runs ``unit``."""
    return Settings(
        hosts={
            "gpu-node-1": {
                "address": "10.0.0.5",
                "user": user,
                "become": "sudo",
                "known_hosts": "/dev/null",
            }
        },
        services={
            service: {
                "hosts": ["gpu-node-1"],
                "unit": unit,
                "python": "/opt/venvs/vllm/bin/python",
                "uv": "/usr/local/bin/uv",
                "systemctl": "/usr/bin/systemctl",
                "journalctl": "/usr/bin/journalctl",
            }
        },
        maintenance={"systemctl": "/usr/bin/systemctl", "nvidia_smi": "/usr/bin/nvidia-smi"},
        db_path=Path("/nonexistent/audit.db"),
    )


def result(stdout: str, stderr: str = "", exit_status: int = 0) -> CommandResult:
    return CommandResult(("sudo", "-n", "-l"), exit_status, stdout, stderr, 0.0)


LISTING = Probe("gpu-node-1", None, "sudo -l", Kind.COMMANDS)


# ---- the captured collision ---------------------------------------------------------------


def test_doctor_fails_on_the_captured_alias_collision() -> None:
    # Debian 12's sudo 1.9.13p3, two drop-ins the old printer made for vcexpa and vcexpb
    # (SOURCES.md, "privilege"): the warning is on stderr of every sudo command.
    stdout = (SAMPLES / "sudo_l_alias_already_defined.txt").read_text()
    stderr = (SAMPLES / "sudo_l_alias_already_defined_stderr.txt").read_text()
    assert duplicate_aliases(stderr) == [
        "KIMI_K25_ROOT (/etc/sudoers.d/vllm_chatops_test_cap_b:63)",
        "HOST_MAINT_ROOT (/etc/sudoers.d/vllm_chatops_test_cap_b:88)",
    ]
    # visudo -c says the same (and exits 1).
    visudo = (SAMPLES / "sudo_alias_already_defined_visudo.txt").read_text()
    assert [a.split(" ")[0] for a in duplicate_aliases(visudo)] == [
        "KIMI_K25_ROOT",
        "HOST_MAINT_ROOT",
    ]
    # the listing itself shows the other deployment's unit under vcexpb's name
    assert "vllm-kimi-k25" in stdout and "vllm-kimi-b" not in stdout

    s = settings("vcexpb", "vllm-kimi-b")
    check = judge(LISTING, Answer(results=(result(stdout, stderr),)), s)
    assert check.outcome == Outcome.FAIL, check
    assert "defined twice on this host: KIMI_K25_ROOT (/etc/sudoers.d/" in check.detail
    assert "vcexpb's rules may allow another drop-in's commands" in check.detail
    assert "python -m bot sudoers --user vcexpb" in check.fix

    # The control: the same listing without the warning is judged on its rules (the
    # other unit's commands are beyond what vcexpb's bot needs: a warning, not this).
    plain = judge(LISTING, Answer(results=(result(stdout),)), s)
    assert plain.outcome == Outcome.WARN and "twice" not in plain.detail


def test_sudos_other_warnings_are_no_collision() -> None:
    # A host whose sudo warns of something else (an unknown Defaults option, an unused
    # alias) is judged on its listing as before.
    said = (
        '/etc/sudoers.d/other:3:10: unknown defaults entry "bogus"\n'
        '/etc/sudoers.d/other:4:11: unused Cmnd_Alias "UNUSED"\n'
    )
    assert duplicate_aliases(said) == []


# ---- the printer ---------------------------------------------------------------------------


def test_each_alias_starts_with_the_login() -> None:
    a = render(settings("chatops", "vllm-kimi-k25"), "chatops")
    b = render(settings("chatops2", "vllm-kimi-b"), "chatops2")

    def defined(text: str) -> set[str]:
        return {line.split()[1] for line in text.splitlines() if line.startswith("Cmnd_Alias ")}

    assert defined(a) == {"CHATOPS__KIMI_K25_ROOT", "CHATOPS__HOST_MAINT_ROOT"}
    assert defined(b) == {"CHATOPS2__KIMI_K25_ROOT", "CHATOPS2__HOST_MAINT_ROOT"}
    assert alias("vllm-bot", "kimi-k25", Privilege.VENV_OWNER) == "VLLM_BOT__KIMI_K25_VENV"
    # a login that starts with "_" still gives a name that starts with a letter
    assert host_alias("_bot") == "BOT__HOST_MAINT_ROOT"
    assert host_alias("_1bot") == "L_1BOT__HOST_MAINT_ROOT"


def test_two_services_of_one_drop_in_that_would_share_an_alias_are_refused() -> None:
    s = settings("chatops", "vllm-kimi-k25")
    two = s.model_copy(
        update={
            "services": {
                "kimi-k25": s.services["kimi-k25"],
                "kimi.k25": s.services["kimi-k25"].model_copy(update={"unit": "vllm-other"}),
            }
        }
    )
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "service kimi-k25 and service kimi.k25 would share the sudoers alias "
            "CHATOPS__KIMI_K25_ROOT"
        ),
    ):
        render(two, "chatops")


# ---- the real sudo -------------------------------------------------------------------------


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, check=False, stdin=subprocess.DEVNULL
    )


@pytest.fixture
def two_logins() -> Iterator[tuple[str, str]]:
    require_root_and_sudo()
    with workspace() as base, accounts(base) as first, accounts(base) as second:
        yield first.login, second.login


def test_two_logins_drop_ins_keep_their_own_rules_under_the_real_sudo(
    two_logins: tuple[str, str],
) -> None:
    first, second = two_logins
    texts = [
        render(settings(first, "vllm-kimi-k25"), first),
        render(settings(second, "vllm-kimi-b"), second),
    ]
    with drop_ins_installed(texts):
        check = _run("visudo", "-c")
        listed = _run("sudo", "-l", "-U", second)
        own = _run(
            "runuser", "-u", second, "--", "sudo", "-n", "-l",
            "/usr/bin/systemctl", "stop", "--no-pager", "--", "vllm-kimi-b",
        )  # fmt: skip
        other = _run(
            "runuser", "-u", second, "--", "sudo", "-n", "-l",
            "/usr/bin/systemctl", "stop", "--no-pager", "--", "vllm-kimi-k25",
        )  # fmt: skip
        as_second = _run("runuser", "-u", second, "--", "sudo", "-n", "-l")
    assert check.returncode == 0 and "already defined" not in check.stdout + check.stderr, (
        check.stdout + check.stderr
    )
    assert "already defined" not in listed.stderr, listed.stderr
    # its rules (the Defaults above them list every drop-in's command-bound entries)
    rules = listed.stdout.split(f"User {second} may run the following commands", 1)[1]
    assert "-- vllm-kimi-b" in rules and "vllm-kimi-k25" not in rules
    assert own.returncode == 0, own.stderr
    assert other.returncode == 1  # the first login's unit is not the second's
    # doctor's listing check on what the real sudo said to the second login
    s = settings(second, "vllm-kimi-b")
    ok = judge(LISTING, Answer(results=(result(as_second.stdout, as_second.stderr),)), s)
    assert ok.outcome == Outcome.OK, ok.detail


def test_doctor_fails_where_the_real_sudo_warns_of_a_duplicate(
    two_logins: tuple[str, str],
) -> None:
    # Another drop-in, sorted first, that defines one of the bot's alias names: sudo binds
    # the bot's rule to that file's command (here `id`) and warns on every call.
    first, _ = two_logins
    ours = render(settings(first, "vllm-kimi-k25"), first)
    name = alias(first, "kimi-k25", Privilege.ROOT)
    foreign = f"Cmnd_Alias {name} = /usr/bin/id\n"
    with drop_ins_installed([foreign, ours]):
        said = _run("runuser", "-u", first, "--", "sudo", "-n", "-l")
    assert f'Alias "{name}" already defined' in said.stderr, said.stderr
    check = judge(
        LISTING,
        Answer(results=(result(said.stdout, said.stderr),)),
        settings(first, "vllm-kimi-k25"),
    )
    assert check.outcome == Outcome.FAIL and name in check.detail, check.detail
