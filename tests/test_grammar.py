"""The /vllm grammar: every valid form, every error, and a fuzz test that the
parser only ever returns safe, configured values or raises InputError."""

from __future__ import annotations

import dataclasses
import re
import string
from typing import Literal

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st
from packaging.version import Version

from bot.core.status import Action
from bot.errors import InputError
from bot.settings import Settings
from bot.slack.blocks import escape
from bot.slack.grammar import (
    AUDIT_DEFAULT,
    COMMANDS,
    LOGS_DEFAULT,
    USAGE,
    Audit,
    Cancel,
    Command,
    Doctor,
    Drain,
    Gpus,
    Help,
    Host,
    Logs,
    Redeploy,
    Releases,
    Restart,
    Rollback,
    Rotation,
    Status,
    Undrain,
    When,
    parse_command,
    run_id_of,
    usage,
)

SAFE = re.compile(r"[A-Za-z0-9._+-]+")


def make_settings() -> Settings:
    return Settings(
        hosts={
            "gpu01": {"address": "local"},
            "gpu02": {"address": "local"},
            # A host named like a service, to pin down which one `gpus` picks.
            "shared": {"address": "local"},
        },
        services={
            "kimi-k25": {
                "hosts": ["gpu01"],
                "unit": "vllm-kimi.service",
                "python": "/opt/venvs/kimi/bin/python",
                "indexes": {
                    "nightly": "https://wheels.vllm.ai/nightly",
                    "pypi": "https://pypi.org/simple",
                },
            },
            "qwen3": {
                "hosts": ["gpu02"],
                "unit": "vllm-qwen.service",
                "python": "/opt/venvs/qwen/bin/python",
                # Side by side: the only service `rollback` takes.
                "strategy": "side_by_side",
            },
            "shared": {
                "hosts": ["gpu01", "gpu02"],
                "unit": "vllm-shared.service",
                "python": "/opt/venvs/shared/bin/python",
                # Two replicas behind a router: the rotation commands take it.
                "router": "front",
                "router_servers": {"gpu01": "node1", "gpu02": "node2"},
            },
        },
        routers={
            "front": {
                "kind": "command",
                "host": "shared",
                "drain": ["/usr/local/bin/lb", "out", "{server}"],
                "undrain": ["/usr/local/bin/lb", "in", "{server}"],
            }
        },
    )


SETTINGS = make_settings()


def parse(text: str) -> Command:
    return parse_command(text, SETTINGS)


def error(text: str, settings: Settings = SETTINGS) -> str:
    with pytest.raises(InputError) as exc:
        parse_command(text, settings)
    return str(exc.value)


# --- valid forms -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", Help()),
        ("   ", Help()),
        ("help", Help()),
        ("HELP", Help()),
        ("redeploy kimi-k25", Redeploy("kimi-k25")),
        ("Redeploy kimi-k25", Redeploy("kimi-k25")),
        ("redeploy kimi-k25 --dry-run", Redeploy("kimi-k25", dry_run=True)),
        ("redeploy --dry-run kimi-k25", Redeploy("kimi-k25", dry_run=True)),
        ("redeploy kimi-k25 --version 0.16.0", Redeploy("kimi-k25", version="0.16.0")),
        ("redeploy kimi-k25 --version=0.16.0", Redeploy("kimi-k25", version="0.16.0")),
        (
            "redeploy kimi-k25 --version 0.16.0rc2.dev313+g662205d34",
            Redeploy("kimi-k25", version="0.16.0rc2.dev313+g662205d34"),
        ),
        # Rendered canonical, as pip/uv would name it.
        ("redeploy kimi-k25 --version v0.16.0-RC2", Redeploy("kimi-k25", version="0.16.0rc2")),
        ("redeploy kimi-k25 --version 1.0+ABC_x", Redeploy("kimi-k25", version="1.0+abc.x")),
        ("redeploy kimi-k25 --index nightly", Redeploy("kimi-k25", index="nightly")),
        ("redeploy kimi-k25 --index=pypi", Redeploy("kimi-k25", index="pypi")),
        (
            "redeploy kimi-k25 --version=0.16.0 --index nightly --dry-run",
            Redeploy("kimi-k25", version="0.16.0", index="nightly", dry_run=True),
        ),
        ("\tredeploy \t kimi-k25  --dry-run \n", Redeploy("kimi-k25", dry_run=True)),
        ("restart qwen3", Restart("qwen3")),
        ("restart qwen3 --force", Restart("qwen3", force=True)),
        (
            "redeploy kimi-k25 --force --version 0.16.0",
            Redeploy("kimi-k25", version="0.16.0", force=True),
        ),
        ("status", Status()),
        ("status qwen3", Status("qwen3")),
        ("gpus", Gpus()),
        ("gpus gpu01", Gpus("gpu01", "host")),
        ("gpus kimi-k25", Gpus("kimi-k25", "service")),
        # A name that is both a host and a service means the host.
        ("gpus shared", Gpus("shared", "host")),
        ("logs qwen3", Logs("qwen3", LOGS_DEFAULT)),
        ("logs qwen3 -n 200", Logs("qwen3", 200)),
        ("logs -n=1 qwen3", Logs("qwen3", 1)),
        ("logs qwen3 -n 1000", Logs("qwen3", 1000)),
        ("logs qwen3 -n 007", Logs("qwen3", 7)),
        ("audit", Audit(None, AUDIT_DEFAULT)),
        ("audit qwen3", Audit("qwen3", AUDIT_DEFAULT)),
        ("audit --limit 200", Audit(None, 200)),
        ("audit qwen3 --limit=5", Audit("qwen3", 5)),
        ("cancel 12", Cancel(12)),
        ("cancel #12", Cancel(12)),
        ("cancel 9223372036854775807", Cancel(2**63 - 1)),
        ("host reboot gpu01", Host(Action.REBOOT, "gpu01")),
        ("Host Reboot gpu01 --at 02:00", Host(Action.REBOOT, "gpu01", (), When("02:00"))),
        ("host gpu-reset gpu02", Host(Action.GPU_RESET, "gpu02")),
        ("host reboot gpu01 --force", Host(Action.REBOOT, "gpu01", force=True)),
        ("host gpu-reset gpu02 3 0", Host(Action.GPU_RESET, "gpu02", (0, 3))),
        (
            "host gpu-reset gpu02 0 7 --now",
            Host(Action.GPU_RESET, "gpu02", (0, 7), When(None, True)),
        ),
    ],
)
def test_valid_forms(text: str, expected: Command) -> None:
    assert parse(text) == expected


def test_commands_are_frozen() -> None:
    cmd = parse("redeploy kimi-k25")
    with pytest.raises(AttributeError):
        cmd.service = "qwen3"  # type: ignore[misc, union-attr]


def test_usage_covers_every_command_in_order() -> None:
    assert list(USAGE) == list(COMMANDS)
    for name in COMMANDS:
        # Each usage line starts with its own subcommand, and usage() adds the prefix.
        assert USAGE[name].split()[0] == name
        assert usage(name) == f"/vllm {USAGE[name]}"
    # Every subcommand in the usage table is really accepted by the parser.
    accepted = {
        "help": "help",
        "redeploy": "redeploy kimi-k25",
        "restart": "restart kimi-k25",
        "rollback": "rollback qwen3",
        "status": "status",
        "rotation": "rotation shared",
        "drain": "drain shared gpu01",
        "undrain": "undrain shared gpu02",
        "gpus": "gpus",
        "logs": "logs kimi-k25",
        "releases": "releases kimi-k25",
        "audit": "audit",
        "cancel": "cancel 1",
        "doctor": "doctor",
        "host": "host reboot gpu01",
    }
    assert set(accepted) == set(COMMANDS)
    for text in accepted.values():
        parse(text)


# --- errors --------------------------------------------------------------------


def test_unknown_subcommand_lists_the_commands() -> None:
    msg = error("deploy kimi-k25")
    assert "Unknown command 'deploy'" in msg
    for name in COMMANDS:
        assert name in msg


def test_unknown_service_lists_configured_services() -> None:
    for text in (
        "redeploy nope",
        "restart nope",
        "status nope",
        "logs nope",
        "audit nope",
        "redeploy KIMI-K25",
    ):
        msg = error(text)
        assert "Unknown service" in msg
        assert "kimi-k25, qwen3, shared" in msg


def test_unknown_service_when_none_configured() -> None:
    msg = error("restart x", Settings())
    assert "no services configured" in msg


def test_unknown_gpus_target_lists_hosts_and_services() -> None:
    msg = error("gpus gpu99")
    assert "Unknown host or service 'gpu99'" in msg
    assert "gpu01, gpu02, shared" in msg
    assert "kimi-k25, qwen3, shared" in msg


def test_unknown_index_lists_the_services_indexes() -> None:
    msg = error("redeploy kimi-k25 --index test")
    assert "Unknown package index 'test' for kimi-k25" in msg
    assert "nightly, pypi" in msg
    assert "no indexes configured" in error("redeploy qwen3 --index nightly")


@pytest.mark.parametrize(
    "version",
    ["latest", "0.16.0.", "1..2", "0.16.0rc2+", "1.0+g66..2", "1.0_beta_x", "=1.0", "1" * 101],
)
def test_invalid_versions_are_rejected(version: str) -> None:
    msg = error(f"redeploy kimi-k25 --version {version}")
    assert "not a valid PEP 440 version" in msg
    assert "0.31.0rc2.dev313+g662205d34" in msg  # shows an example of a good one


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("redeploy", "Missing the service name"),
        ("restart", "Missing the service name"),
        ("logs", "Missing the service name"),
        ("cancel", "Missing the run id"),
        ("help me", "help takes no arguments"),
        ("restart qwen3 now", "Unexpected extra words: 'now'"),
        ("status qwen3 kimi-k25", "Unexpected extra words: 'kimi-k25'"),
        ("gpus gpu01 gpu02", "Unexpected extra words"),
        ("redeploy kimi-k25 qwen3", "Unexpected extra words"),
        ("redeploy kimi-k25 --later", "Unknown option '--later' for redeploy"),
        (
            "restart qwen3 --dry-run",
            "Unknown option '--dry-run' for restart (options: --at, --now, --force)",
        ),
        ("redeploy kimi-k25 --force=yes", "--force takes no value"),
        ("logs qwen3 --lines 5", "Unknown option '--lines'"),
        ("logs qwen3 -", "Unknown option '-'"),
        ("redeploy kimi-k25 --dry-run --dry-run", "--dry-run is given more than once"),
        ("redeploy kimi-k25 --version 1 --version=2", "--version is given more than once"),
        ("logs qwen3 -n 5 -n 6", "-n is given more than once"),
        ("redeploy kimi-k25 --dry-run=yes", "--dry-run takes no value"),
        ("redeploy kimi-k25 --version", "--version needs a value"),
        ("redeploy kimi-k25 --version=", "--version needs a value"),
        ("redeploy kimi-k25 --version --dry-run", "--version needs a value"),
        ("redeploy kimi-k25 --index", "--index needs a value"),
        ("logs qwen3 -n", "-n needs a value"),
        ("logs qwen3 -n 0", "-n must be a whole number from 1 to 1000, not '0'"),
        ("logs qwen3 -n 1001", "from 1 to 1000"),
        ("logs qwen3 -n -5", "from 1 to 1000, not '-5'"),
        ("logs qwen3 -n five", "not 'five'"),
        ("logs qwen3 -n 1e3", "not '1e3'"),
        ("logs qwen3 -n 99999999999999999999", "from 1 to 1000"),
        ("audit --limit 0", "--limit must be a whole number from 1 to 200"),
        ("audit --limit 201", "from 1 to 200"),
        ("cancel 0", "'0' is not a run id"),
        ("cancel -3", "Unknown option '-3'"),
        ("cancel #", "'#' is not a run id"),
        ("cancel ##1", "'##1' is not a run id"),
        ("cancel abc", "'abc' is not a run id"),
        ("cancel 9223372036854775808", "is not a run id"),
        ("cancel 1 2", "Unexpected extra words"),
        ("host", "say what to do and to which host"),
        ("host reboot", "say what to do and to which host"),
        ("host restart gpu01", "say what to do and to which host"),
        ("host reboot gpu09", "Unknown host 'gpu09'"),
        ("host reboot gpu01 0", "a reboot takes no GPU indexes"),
        ("host gpu-reset gpu01 x", "'x' is not a GPU index"),
        ("host gpu-reset gpu01 64", "'64' is not a GPU index (0 to 63)"),
        ("host gpu-reset gpu01 1 1", "GPU 1 is named twice"),
        ("host reboot gpu01 --dry-run", "Unknown option '--dry-run' for host"),
    ],
)
def test_argument_errors(text: str, fragment: str) -> None:
    msg = error(text)
    assert fragment in msg
    # Argument errors end with the usage of the subcommand that was typed.
    assert msg.endswith(f"Usage: `{escape(usage(text.split()[0]))}`")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("restart qwen3;reboot", "';'"),
        ("restart qwen3|cat", "'|'"),
        ("restart qwen3&", "'&amp;'"),
        ("restart $(id)", "'$', '(', ')'"),
        ("restart `id`", "'`'"),
        ("restart <qwen3>", "'&lt;', '&gt;'"),
        ("restart {a}", "'{', '}'"),
        ("restart [a]", "'[', ']'"),
        ("restart q*", "'*'"),
        ("restart q?", "'?'"),
        ("restart !1", "'!'"),
        ("restart ~root", "'~'"),
        ("restart 'qwen3'", "'\\''"),
        # A pair of quotes around a whole word goes (--at "02:00"); one inside stays refused.
        ('restart qw"en3', "'\"'"),
        ('restart "qwen3', "'\"'"),
        ("restart qwen3\\", "'\\\\'"),
        ("restart qwen3\nreboot", "'\\n'"),
        ("restart qwen3\x00", "'\\x00'"),
        ("restart qwen3\x1b[31m", "'\\x1b'"),
        ("restart qwen3\rreboot", "'\\r'"),
        # A newline at the end of a word is still caught ("$" would let it through).
        ("restart qwen3\n now", "'\\n'"),
        ("redeploy kimi-k25 --version 1.0\n --dry-run", "'\\n'"),
        ("restart qwén3", "'\\xe9'"),
        ("restart qwen3\u200b", "'\\u200b'"),
        ("restart qwen3\xa0--dry-run", "'\\xa0'"),
        ("restart a,b", "','"),
        ("restart /etc/passwd", "'/'"),
    ],
)
def test_disallowed_characters(text: str, shown: str) -> None:
    msg = error(text)
    assert "contains characters that are not allowed: " + shown in msg
    assert msg.isascii()
    # Control characters are never echoed back verbatim.
    assert all(c.isprintable() for c in msg)


def test_disallowed_characters_name_the_word() -> None:
    assert error("redeploy kimi-k25 --version=1;id").startswith(
        "Word 3 '--version=1;id' contains characters that are not allowed: ';'"
    )


def test_smart_dash_gets_a_hint() -> None:
    msg = error("redeploy kimi-k25 \u2014dry-run")
    assert "'\\u2014'" in msg
    assert "type two hyphens" in msg


def test_subcommand_with_bad_characters_is_a_character_error() -> None:
    assert "not allowed: '\\x07'" in error("\x07")


def test_overlong_input_is_not_echoed() -> None:
    text = "restart " + "q" * 600
    msg = error(text)
    assert "608 characters long; the limit is 500" in msg
    assert "q" * 20 not in msg
    # Exactly at the limit is still parsed (and then fails on its merits).
    at_limit = "restart " + "q" * 492
    assert "Unknown service" in error(at_limit)
    assert "q" * 61 not in error(at_limit)  # long names are shown cut short


# --- fuzz ----------------------------------------------------------------------

_NAMES = sorted({*SETTINGS.services, *SETTINGS.hosts, "nightly", "pypi"})
_WORDS = st.one_of(
    st.sampled_from([*COMMANDS, "--version", "--index", "--dry-run", "-n", "--limit", "#"]),
    st.sampled_from(_NAMES),
    st.from_regex(r"\A[0-9]{1,4}(\.[0-9]{1,3}){0,3}((a|b|rc)[0-9])?(\+[a-z0-9.]{1,9})?\Z"),
    st.from_regex(r"\A--?[a-z-]{1,9}(=[A-Za-z0-9.+]{0,9})?\Z"),
    st.text(alphabet=string.printable, max_size=12),
    st.text(alphabet=";|&$`<>(){}[]*?!~'\"\\\n\x00#=", max_size=4),
    st.text(max_size=8),  # arbitrary unicode
)


_VERSIONS = st.from_regex(
    r"\A[0-9]{1,4}(\.[0-9]{1,3}){0,3}((a|b|rc)[0-9])?(\.dev[0-9]{1,3})?(\+[a-z0-9]{1,5}(\.[a-z0-9]{1,5})?)?\Z"
)
_COUNTS = st.integers(-2, 1200).map(str)
# Per subcommand, the kinds of words it takes, so most drawn commands are valid.
_ARGS: dict[str, st.SearchStrategy[str]] = {
    "redeploy": st.one_of(
        st.sampled_from(_NAMES),
        st.just("--dry-run"),
        _VERSIONS.map(lambda v: f"--version={v}"),
        st.sampled_from(["nightly", "pypi", "test"]).map(lambda i: f"--index={i}"),
    ),
    "logs": st.one_of(st.sampled_from(_NAMES), _COUNTS.map(lambda n: f"-n={n}")),
    "audit": st.one_of(st.sampled_from(_NAMES), _COUNTS.map(lambda n: f"--limit={n}")),
    "cancel": st.one_of(_COUNTS, _COUNTS.map(lambda n: f"#{n}")),
}


@st.composite
def command_texts(draw: st.DrawFn) -> str:
    if draw(st.booleans()):
        # Mostly-valid commands, so the success path is exercised, not just errors.
        cmd = draw(st.sampled_from(COMMANDS))
        args = _ARGS.get(cmd, st.sampled_from(_NAMES))
        words = [cmd, *draw(st.lists(args, max_size=3))]
        if draw(st.integers(0, 4)) == 0:
            pos = draw(st.integers(0, len(words) - 1))
            words[pos] += draw(_WORDS)
    else:
        words = draw(st.lists(_WORDS, max_size=7))
    seps = st.sampled_from([" ", " ", " ", " ", "  ", "\t", "\n", "\xa0"])
    text = "".join(draw(seps) + w for w in words)
    if draw(st.integers(0, 9)) == 0:
        text += draw(st.sampled_from(["\n", " x" * 300]))
    return text


def assert_safe(cmd: Command) -> None:
    configured_services = set(SETTINGS.services)
    match cmd:
        case Help():
            pass
        case Redeploy(service=s, version=v, index=i, dry_run=d):
            assert s in configured_services
            assert v is None or SAFE.fullmatch(v)
            assert i is None or i in SETTINGS.services[s].indexes
            assert isinstance(d, bool)
        case Restart(service=s) | Logs(service=s) | Releases(service=s) | Rollback(service=s):
            assert s in configured_services
        case Status(service=s) | Audit(service=s):
            assert s is None or s in configured_services
        case Gpus(target=t, kind=k) | Doctor(target=t, kind=k):
            assert (
                (t, k) == (None, None)
                or (k == "host" and t in SETTINGS.hosts)
                or (k == "service" and t in configured_services)
            )
        case Cancel(run_id=r):
            assert 1 <= r <= 2**63 - 1
        case Rotation(service=s):
            assert SETTINGS.services[s].router is not None
        case Drain(service=s, host=h) | Undrain(service=s, host=h):
            assert SETTINGS.services[s].router is not None and h in SETTINGS.services[s].hosts
        case Host(action=a, host=h, gpus=g):
            # Only a configured host, and GPU indexes as numbers in range, each once.
            assert a.host_wide and h in SETTINGS.hosts
            assert list(g) == sorted(set(g)) and all(0 <= i <= 63 for i in g)
        case _:
            raise AssertionError(f"unexpected command {cmd!r}")
    for field in dataclasses.fields(cmd):
        value = getattr(cmd, field.name)
        if isinstance(value, str):
            assert SAFE.fullmatch(value), value
    match cmd:
        case Logs(lines=n):
            assert 1 <= n <= 1000
        case Audit(limit=n):
            assert 1 <= n <= 200


@hyp_settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(command_texts())
def test_fuzz_parser_returns_safe_command_or_input_error(text: str) -> None:
    try:
        cmd = parse(text)
    except InputError as e:
        msg = str(e)
        assert msg.isascii()
        assert all(c.isprintable() for c in msg)
        assert len(msg) < 1000
        # Slack shows the answer as mrkdwn: nothing typed may become a mention or a link.
        assert "<" not in msg and ">" not in msg
        return
    assert_safe(cmd)


@hyp_settings(max_examples=200, deadline=None)
@given(st.text(max_size=600))
def test_fuzz_arbitrary_text(text: str) -> None:
    try:
        cmd = parse(text)
    except InputError:
        return
    assert_safe(cmd)


def _flag(draw: st.DrawFn, flag: str, value: str) -> list[str]:
    return [f"{flag}={value}"] if draw(st.booleans()) else [flag, value]


@st.composite
def valid_commands(draw: st.DrawFn) -> tuple[str, Command]:
    """A valid command text (flags in any order and either form) and its parse."""
    name = draw(st.sampled_from(COMMANDS))
    services = sorted(SETTINGS.services)
    head: list[str] = [draw(st.sampled_from([name, name.upper(), name.capitalize()]))]
    flags: list[list[str]] = []
    expected: Command
    if name == "redeploy":
        svc = draw(st.sampled_from(services))
        version = draw(st.none() | _VERSIONS)
        indexes = sorted(SETTINGS.services[svc].indexes)
        index = draw(st.none() | st.sampled_from(indexes)) if indexes else None
        dry = draw(st.booleans())
        head.append(svc)
        if version is not None:
            flags.append(_flag(draw, "--version", version))
        if index is not None:
            flags.append(_flag(draw, "--index", index))
        if dry:
            flags.append(["--dry-run"])
        canonical = None if version is None else str(Version(version))
        expected = Redeploy(svc, canonical, index, dry)
    elif name in ("restart", "logs", "releases", "rollback"):
        svc = "qwen3" if name == "rollback" else draw(st.sampled_from(services))
        head.append(svc)
        if name == "restart":
            expected = Restart(svc)
        elif name == "releases":
            expected = Releases(svc)
        elif name == "rollback":
            expected = Rollback(svc)
        else:
            n = draw(st.none() | st.integers(1, 1000))
            if n is not None:
                flags.append(_flag(draw, "-n", str(n)))
            expected = Logs(svc, LOGS_DEFAULT if n is None else n)
    elif name in ("status", "audit"):
        opt = draw(st.none() | st.sampled_from(services))
        head += [] if opt is None else [opt]
        if name == "status":
            expected = Status(opt)
        else:
            limit = draw(st.none() | st.integers(1, 200))
            if limit is not None:
                flags.append(_flag(draw, "--limit", str(limit)))
            expected = Audit(opt, AUDIT_DEFAULT if limit is None else limit)
    elif name in ("gpus", "doctor"):
        target = draw(st.none() | st.sampled_from(sorted({*SETTINGS.hosts, *services})))
        head += [] if target is None else [target]
        kind: Literal["host", "service"] | None = (
            None if target is None else "host" if target in SETTINGS.hosts else "service"
        )
        expected = Gpus(target, kind) if name == "gpus" else Doctor(target, kind)
    elif name == "rotation":
        head.append("shared")
        expected = Rotation("shared")
    elif name in ("drain", "undrain"):
        host = draw(st.sampled_from(["gpu01", "gpu02"]))
        head += ["shared", host]
        expected = Drain("shared", host) if name == "drain" else Undrain("shared", host)
        # the two positionals keep their order; only flags could move (there are none)
        return draw(st.sampled_from([" ", "  ", "\t"])).join(head), expected
    elif name == "cancel":
        run_id = draw(st.integers(1, 2**63 - 1))
        head.append(draw(st.sampled_from(["", "#"])) + str(run_id))
        expected = Cancel(run_id)
    elif name == "host":
        host = draw(st.sampled_from(["gpu01", "gpu02"]))
        op = draw(st.sampled_from(["reboot", "gpu-reset"]))
        gpus = draw(st.lists(st.integers(0, 63), unique=True, max_size=4)) if op != "reboot" else []
        head += [op, host, *map(str, gpus)]
        action = Action.REBOOT if op == "reboot" else Action.GPU_RESET
        expected = Host(action, host, tuple(sorted(gpus)))
        return draw(st.sampled_from([" ", "  ", "\t"])).join(head), expected
    else:
        expected = Help()
    words = head[:1] + draw(st.permutations([head[1:], *flags])) if len(head) > 1 or flags else head
    flat = [w for part in words for w in ([part] if isinstance(part, str) else part)]
    return draw(st.sampled_from([" ", "  ", "\t"])).join(flat), expected


@hyp_settings(max_examples=300, deadline=None)
@given(valid_commands())
def test_fuzz_valid_commands_parse_exactly(case: tuple[str, Command]) -> None:
    text, expected = case
    cmd = parse(text)
    assert cmd == expected
    assert_safe(cmd)


# --- run ids in button values ------------------------------------------------------
# A button's value is the run id the bot put there, but Slack delivers whatever a
# signed request says.  Issue 9: a 30-digit value raised OverflowError (from SQLite)
# and the click got no reply; Unicode digits pass str.isdigit().


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("12", 12),
        ("1", 1),
        ("9223372036854775807", 2**63 - 1),
        ("007", 7),
    ],
)
def test_run_id_of_reads_a_run_id(value: str, expected: int) -> None:
    assert run_id_of(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "1" * 30,  # the 30-digit value of the issue
        "9223372036854775808",  # one past SQLite's largest INTEGER
        "0" * 20 + "1",  # short in value, long in text
        "0",
        "",
        "-1",
        "+1",
        " 12",
        "12\n",
        "1_000",
        "#12",
        "\u0661\u0662",  # ARABIC-INDIC DIGITS ONE, TWO: "١٢".isdigit() is True
        "\u00b2",  # SUPERSCRIPT TWO: "²".isdigit() is True, int("²") raises ValueError
        "\uff11\uff12",  # FULLWIDTH DIGITS: "１２".isdigit() is True
    ],
)
def test_run_id_of_refuses_anything_else(value: str) -> None:
    assert run_id_of(value) is None


def test_cancel_takes_the_same_run_ids() -> None:
    settings = make_settings()
    assert parse_command("cancel #9223372036854775807", settings) == Cancel(2**63 - 1)
    with pytest.raises(InputError, match="is not a run id"):
        parse_command(f"cancel {'1' * 30}", settings)
    # Typed text meets the character check first.
    with pytest.raises(InputError, match="not allowed"):
        parse_command("cancel \u0661\u0662", settings)


# --- the rotation commands (issue 19) ------------------------------------------------


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("rotation kimi-k25", "kimi-k25 has no router configured"),
        ("drain kimi-k25 gpu01", "kimi-k25 has no router configured"),
        ("drain shared", "Give the service and one of its hosts."),
        ("undrain shared gpu01 gpu02", "Give the service and one of its hosts."),
        ("drain shared lb-9", "'lb-9' is not a host of shared. Its hosts: gpu01, gpu02."),
        ("undrain nope gpu01", "Unknown service 'nope'"),
        ("rotation", "Missing the service name."),
    ],
)
def test_rotation_commands_take_only_a_routed_service_and_its_hosts(text: str, needle: str) -> None:
    assert needle in error(text)
