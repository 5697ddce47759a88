"""The bot's fixed HAProxy script (bot.core.routers.haproxy_script) and its sudo rules,
run for real: the script under /bin/sh (dash, Debian 12), Debian's sudo 1.9.13p3 as a
non-root login with the drop-in ``python -m bot sudoers`` prints, Debian's HAProxy 2.6
with an admin socket only root may open.

The rule used to be socat to the socket as root, which let the bot's key send any
Runtime API command on any backend. Now only ``show stat`` and ``set server
<backend>/<server> state ready|drain|maint`` for the configured backend and servers get
through: sudo refuses every other command line, and the script refuses anything else
again itself (run as root without sudo, as a host with ``become = "none"`` runs it)."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bot.core.become import become_for
from bot.core.doctor import Answer, Kind, Outcome, Probe, judge
from bot.core.results import CommandResult
from bot.core.routers import haproxy, haproxy_script
from bot.core.routers.haproxy_script import (
    REFUSED_EXIT,
    SHOW_STAT,
    runtime_command,
    set_state_words,
)
from bot.core.sudoers import render
from bot.core.sudoers_router import router_grants
from bot.settings import HAPROXY_NAME_RE, Settings
from tests.support import routers
from tests.support.nonroot import accounts, require_root_and_sudo, sudoers_installed, workspace

SOCAT = "/usr/bin/socat"
BACKEND = "vllm_kimi"
# A server named as its address: HAProxy allows ":" in names, and such names are common.
ADDRESS_NAMED = "10.0.0.5:8000"


# ---- the script alone, with a socat that prints what it would send ------------------------


@pytest.fixture(scope="module")
def fake_socat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(a socat that prints its stdin, a socket path): what the script sends, read back."""
    root = tmp_path_factory.mktemp("fake_socat")
    socat = root / "socat"
    socat.write_text("#!/bin/sh\nexec /bin/cat\n")
    socat.chmod(0o755)
    yield str(socat), str(root / "admin.sock")


def sent(fake: tuple[str, str], words: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    socat, socket = fake
    return subprocess.run(
        runtime_command(socat, socket, BACKEND, words),
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_the_two_commands_are_sent_as_exactly_one_line(fake_socat: tuple[str, str]) -> None:
    r = sent(fake_socat, SHOW_STAT)
    assert (r.returncode, r.stdout, r.stderr) == (0, "show stat\n", "")
    for server in ("node1", ADDRESS_NAMED):
        for state in haproxy_script.STATES:
            r = sent(fake_socat, set_state_words(BACKEND, server, state))
            assert r.stdout == f"set server {BACKEND}/{server} state {state}\n", r.stderr


REFUSED = [
    ("set", "server", "otherbackend/x", "state", "maint"),
    ("disable", "frontend", "fe"),
    ("expert-mode", "on"),
    ("shutdown", "sessions", "server", f"{BACKEND}/node1"),
    ("shutdown", "sessions"),
    ("set", "server", f"{BACKEND}/node1", "state", "drain; disable frontend fe"),
    ("set", "server", f"{BACKEND}/node1", "state", "drain;", "disable", "frontend", "fe"),
    ("set", "server", f"{BACKEND}/node1;disable frontend fe", "state", "drain"),
    ("set", "server", f"{BACKEND}/node1", "state", "drain\ndisable frontend fe"),
    ("set", "server", f"{BACKEND}/node1\nshow stat", "state", "drain"),
    ("set", "server", f"{BACKEND}/node1", "state", "drain\n"),
    ("set", "server", f"{BACKEND}/no de1", "state", "drain"),
    ("set", "server", f"{BACKEND}/node1/x", "state", "drain"),
    ("set", "server", f"{BACKEND}/node1", "weight", "0"),
    ("set", "server", f"{BACKEND}/node1", "state", "stopping"),
    ("set", "server", f"{BACKEND}/node1", "addr", "10.9.9.9"),
    ("set", "weight", f"{BACKEND}/node1", "state", "0"),
    ("show", "stat", "-1"),
    ("show", "sess"),
    ("show stat",),
    (f"set server {BACKEND}/node1 state drain",),
    ("set", f"server {BACKEND}/node1", "state", "drain"),
    ("shutdown", "frontend", "fe"),
    (),
]


@pytest.mark.parametrize("words", REFUSED, ids=[repr(" ".join(w)) for w in REFUSED])
def test_the_script_refuses_anything_else_and_sends_nothing(
    fake_socat: tuple[str, str], words: tuple[str, ...]
) -> None:
    r = sent(fake_socat, words)
    assert r.returncode == REFUSED_EXIT, (r.stdout, r.stderr)
    assert r.stdout == ""  # socat never ran
    assert r.stderr.startswith("refused: "), r.stderr
    assert haproxy_script.refusal(r.stderr) == r.stderr.splitlines()[0]


def test_the_script_refuses_a_socat_or_socket_it_cannot_name_exactly(
    fake_socat: tuple[str, str],
) -> None:
    socat, socket = fake_socat
    for argv in (
        runtime_command("socat", socket, BACKEND, SHOW_STAT),  # found through PATH
        runtime_command(socat, "admin.sock", BACKEND, SHOW_STAT),
        runtime_command(socat, f"{socket},fork", BACKEND, SHOW_STAT),  # a socat option
        runtime_command(socat, f"{socket}:x", BACKEND, SHOW_STAT),
        runtime_command(socat, socket, "vllm kimi", SHOW_STAT),
        runtime_command(socat, socket, "b;shutdown", SHOW_STAT),
    ):
        r = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert (r.returncode, r.stdout) == (REFUSED_EXIT, ""), (argv[4:7], r.stderr)


# Everything a name could hold: HAProxy's own characters, the Runtime API's separators,
# whitespace, "/", shell and glob characters, other letters.
_ALPHABET = st.sampled_from(list("aZ09._:-;/ \t\n\r*?[]!$`'\"\\|&#()é\x7f"))


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(name=st.text(_ALPHABET, min_size=0, max_size=70))
def test_the_script_takes_a_server_name_exactly_when_the_settings_do(
    fake_socat: tuple[str, str], name: str
) -> None:
    # One pattern for both: what the settings accept is what the root script sends, and
    # nothing else (a server named with a newline or ";" never reaches the socket).
    r = sent(fake_socat, set_state_words(BACKEND, name, "drain"))
    took = r.returncode == 0 and r.stdout == f"set server {BACKEND}/{name} state drain\n"
    assert took == (HAPROXY_NAME_RE.fullmatch(name) is not None), (name, r.stderr)
    if not took:
        assert r.returncode == REFUSED_EXIT and r.stdout == ""


@pytest.mark.parametrize("name", ["node1", ADDRESS_NAMED, "a", "gpu-node-1.dc2", "x" * 63])
def test_unusual_but_good_names_are_taken(fake_socat: tuple[str, str], name: str) -> None:
    assert HAPROXY_NAME_RE.fullmatch(name)
    r = sent(fake_socat, set_state_words(BACKEND, name, "ready"))
    assert r.returncode == 0, r.stderr


# ---- the real sudo, the real HAProxy --------------------------------------------------------

OTHER = """\
backend other
    server x 127.0.0.1:9
"""


def lb_settings(login: str, socket: Path) -> Settings:
    host = {"address": "10.0.0.9", "known_hosts": "/k", "user": login, "become": "sudo"}
    return Settings(
        hosts={"lb-1": host, "gpu-node-1": host, "gpu-node-2": host},
        services={
            "kimi": {
                "hosts": ["gpu-node-1", "gpu-node-2"],
                "unit": "vllm-kimi",
                "python": "/opt/venvs/vllm/bin/python",
                "uv": "/usr/local/bin/uv",
                "systemctl": "/usr/bin/systemctl",
                "journalctl": "/usr/bin/journalctl",
                "router": "front",
                "router_servers": {"gpu-node-1": "node1", "gpu-node-2": ADDRESS_NAMED},
                "min_serving": 1,
            }
        },
        routers={
            "front": {"kind": "haproxy", "host": "lb-1", "socket": str(socket), "backend": BACKEND}
        },
        db_path=Path("/nonexistent/audit.db"),
    )


@pytest.fixture
async def lb() -> AsyncIterator[tuple[str, routers.HAProxy]]:
    """A non-root login, and HAProxy with two backends whose admin socket is root's."""
    require_root_and_sudo()
    with workspace() as base, accounts(base) as who:
        async with routers.haproxy(
            base / "haproxy",
            [("node1", 9), (ADDRESS_NAMED, 9)],
            BACKEND,
            check=False,
            extra=OTHER,
        ) as h:
            assert h.socket.stat().st_mode & 0o777 == 0o600  # root's alone
            yield who.login, h


def as_login(login: str, argv: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    """``argv`` as the bot runs it on a sudo host: ``sudo -n -- <argv>`` as the login."""
    return subprocess.run(
        ("runuser", "-u", login, "--", "sudo", "-n", "--", *argv),
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )


async def state(h: routers.HAProxy) -> dict[tuple[str, str], str]:
    """Every proxy's every row and its status (a frontend's OPEN or STOP)."""
    lines = (await h.say("show stat")).lstrip("\n").splitlines()
    header = lines[0][2:].split(",")
    at = {n: header.index(n) for n in ("pxname", "svname", "status")}
    rows = [line.split(",") for line in lines[1:] if line]
    return {(r[at["pxname"]], r[at["svname"]]): r[at["status"]] for r in rows}


async def test_the_printed_rules_let_the_login_send_only_the_two_commands(
    lb: tuple[str, routers.HAProxy],
) -> None:
    login, h = lb
    s = lb_settings(login, h.socket)
    text = render(s, login, ["lb-1"])
    [(_, rules)] = router_grants(s, ["lb-1"])
    assert len(rules) == 1 + 2 * 3  # show stat; two servers, three states each
    assert "socat -t 5 stdio unix-connect" not in text  # the old rule is gone

    def cmd(*words: str) -> tuple[str, ...]:
        return runtime_command(SOCAT, str(h.socket), BACKEND, words)

    with sudoers_installed(text):
        before = await state(h)
        assert before[("fe", "FRONTEND")] == "OPEN" and before[("other", "x")] == "no check"

        # the allowed commands work, and their output is what the parsers read
        r = as_login(login, cmd("show", "stat"))
        assert r.returncode == 0, r.stderr
        views = haproxy.parse_show_stat(r.stdout, BACKEND)
        assert set(views) == {"node1", ADDRESS_NAMED}
        for server in ("node1", ADDRESS_NAMED):
            r = as_login(login, cmd(*set_state_words(BACKEND, server, "drain")))
            assert (r.returncode, haproxy.parse_answer(r.stdout)) == (0, None), r.stderr
        drained = haproxy.parse_show_stat(await h.say("show stat"), BACKEND)
        assert {v.detail for v in drained.values()} == {"DRAIN"}
        for server in ("node1", ADDRESS_NAMED):
            assert as_login(login, cmd(*set_state_words(BACKEND, server, "ready"))).returncode == 0
        assert await state(h) == before

        # everything else is refused: by sudo, as no rule names it, or by the script
        # where sudo's matching cannot tell (it compares the arguments joined by spaces,
        # so the one argument "show stat" matches the rule of `show stat`)
        past_sudo = []
        for words in REFUSED:
            r = as_login(login, cmd(*words))
            if r.returncode == REFUSED_EXIT:
                assert r.stderr.startswith("refused: ") and r.stdout == "", (words, r)
                past_sudo.append(words)
            else:
                assert r.returncode == 1 and "a password is required" in r.stderr, (words, r)
        assert past_sudo == [
            ("show stat",),
            (f"set server {BACKEND}/node1 state drain",),
            ("set", f"server {BACKEND}/node1", "state", "drain"),
        ]
        # nor any other way to the socket as root
        for argv in (
            (SOCAT, "-t", "5", "stdio", f"unix-connect:{h.socket}"),
            ("/bin/sh", "-c", "echo disable frontend fe | socat stdio unix:" + str(h.socket)),
            (*cmd("show", "stat")[:4], SOCAT, str(h.socket), "other", "show", "stat"),
        ):
            assert as_login(login, argv).returncode == 1
        assert await state(h) == before  # HAProxy left untouched

        # and the script refuses the same itself, run as root without sudo
        for words in REFUSED:
            r = subprocess.run(cmd(*words), capture_output=True, text=True, check=False)
            assert (r.returncode, r.stdout) == (REFUSED_EXIT, ""), (words, r.stderr)
        assert await state(h) == before


async def test_a_refusal_names_the_missing_rule(lb: tuple[str, routers.HAProxy]) -> None:
    # What the bot says when the host's drop-in lacks one of the rules (an older drop-in,
    # a server added to router_servers since): the command, the alias and why.
    login, h = lb
    s = lb_settings(login, h.socket)
    drain = runtime_command(
        SOCAT, str(h.socket), BACKEND, set_state_words(BACKEND, "node1", "drain")
    )
    [(_, rules)] = router_grants(s, ["lb-1"])
    [rule] = [g for g in rules if g.sample == drain]
    with sudoers_installed(render(s, login, ["lb-1"], omit=[rule.line()])):
        r = as_login(login, drain)
    assert r.returncode == 1
    become = become_for(s, "lb-1", "kimi")
    assert become is not None
    why = become.refused(drain, drain.run_as, r.returncode, r.stderr)
    assert why is not None
    assert why.startswith(
        "sudo refused the bot's HAProxy script sending "
        f"`set server {BACKEND}/node1 state drain` as root: sudo asked for a password"
    ), why
    assert f"(Cmnd_Alias {login.upper()}__ROUTER_FRONT_ROOT, take node1 out" in why
    assert "LC_ALL=C; export LC_ALL" not in why  # not the script's whole text


@pytest.mark.parametrize("server", ["node1;disable", "node 1", "vllm_kimi/node1", "node1\n", ""])
def test_the_settings_refuse_a_server_name_the_script_would(server: str) -> None:
    s = lb_settings("chatops", Path("/run/haproxy/admin.sock"))  # the control: valid
    assert s.services["kimi"].router_servers["gpu-node-2"] == ADDRESS_NAMED
    data = s.model_dump(include={"hosts", "services", "routers"})
    data["services"]["kimi"]["router_servers"]["gpu-node-1"] = server
    with pytest.raises(ValidationError, match="is not an HAProxy server name"):
        Settings(**data, db_path=Path("/nonexistent/audit.db"))


def test_doctor_reads_the_router_hosts_rules_from_the_real_sudo() -> None:
    # doctor's listing and PATH checks on the router's host: the printed rules are the
    # bot's own and get root's PATH; the old socat rule left installed is one beyond them.
    require_root_and_sudo()
    old_rule = f"{{login}} ALL = (root) NOPASSWD: {SOCAT} -t 5 stdio unix-connect\\:/run/x.sock\n"
    with workspace() as base, accounts(base) as who:
        s = lb_settings(who.login, Path("/run/haproxy/admin.sock"))
        text = render(s, who.login, ["lb-1"])
        checks = {}
        for name, drop_in in (("now", text), ("old", text + old_rule.format(login=who.login))):
            with sudoers_installed(drop_in):
                r = subprocess.run(
                    ("runuser", "-u", who.login, "--", "sudo", "-n", "-l"),
                    capture_output=True,
                    text=True,
                    check=False,
                    stdin=subprocess.DEVNULL,
                )
            said = Answer(
                results=(CommandResult(("sudo", "-n", "-l"), 0, r.stdout, r.stderr, 0.0),)
            )
            checks[name] = {
                probe: judge(Probe("lb-1", None, probe, Kind.COMMANDS), said, s)
                for probe in ("sudo -l", "sudo PATH")
            }
    assert checks["now"]["sudo -l"].outcome == Outcome.OK, checks["now"]["sudo -l"].detail
    assert checks["now"]["sudo -l"].detail == "7 rules, none beyond what the bot needs"
    assert checks["now"]["sudo PATH"].outcome == Outcome.OK
    assert "all 7 rules" in checks["now"]["sudo PATH"].detail
    old = checks["old"]["sudo -l"]
    assert old.outcome == Outcome.WARN and "unix-connect" in old.detail, old.detail
