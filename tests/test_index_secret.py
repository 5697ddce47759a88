"""An index URL with credentials never appears in a remote argv (security review, issue 9):
every user of a GPU host can read the process list.  It goes to uv on stdin, through a
fixed wrapper, into uv's environment (UV_EXTRA_INDEX_URL), and the card and the audit log
show the index by name."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from aiohttp import web

from bot.core import remote
from bot.core.plan import make_plan
from bot.core.redact import Redactor
from bot.core.status import Action, RunStatus
from bot.engine.runtime import open_runtime
from bot.hosts.local import LocalTransport
from bot.logging_setup import RedactingFilter
from bot.settings import ServiceSettings, Settings
from bot.sim import procfs
from bot.sim.kit import SimKit
from bot.sim.state import STATE_DIR_ENV
from bot.slack.blocks import CardView, initial_steps, run_card
from tests.polling import eventually
from tests.slack_harness import CHANNEL, SERVICE, blocks_text, slack_bot
from tests.support.runs import run
from tests.support.sim import sim_settings

TOKEN = "tok-9f8e7d6c5b4a"
PRIVATE = f"https://ci-bot:{TOKEN}@pypi.private.example/simple"
ONLY_ON_PRIVATE = "0.17.0rc1.dev5+g1a2b3c4"


def service(**overrides: object) -> ServiceSettings:
    return ServiceSettings(
        **{
            "hosts": ["h1"],
            "unit": "vllm-kimi",
            "python": "/opt/v/bin/python",
            "indexes": {"private": PRIVATE},
            **overrides,
        }
    )


def test_install_argv_holds_no_index_and_its_stdin_does() -> None:
    svc = service()
    for argv in (
        remote.install_dry_run(svc, "vllm==0.17.0", PRIVATE),
        remote.install(svc, "vllm==0.17.0", PRIVATE),
        remote.install_previous(svc, "0.31.0", PRIVATE),
    ):
        assert argv[:4] == remote.INDEX_FROM_STDIN and argv[4:7] == ("uv", "pip", "install")
        assert not any("pypi.private" in a or TOKEN in a for a in argv)
        shown = remote.shown(argv)
        assert shown.startswith("UV_EXTRA_INDEX_URL=<index URL, on stdin> uv pip install ")
        assert TOKEN not in shown
    assert remote.index_input(PRIVATE) == f"{PRIVATE}\n".encode()
    # Without an index nothing changes: no wrapper, nothing on stdin.
    assert remote.install(svc, "vllm", None)[0] == "uv" and remote.index_input(None) is None


def test_the_plan_and_the_card_name_the_index_and_never_hold_its_url() -> None:
    settings = Settings(
        hosts={"h1": {"address": "10.0.0.1", "known_hosts": "/tmp/kh"}},
        services={"kimi": service().model_dump()},
    )
    plan = make_plan(settings, Action.REDEPLOY, "kimi", version="0.17.0", index="private")
    assert plan.index_url == PRIVATE  # the engine still knows it
    commands = " ".join(s.command for s in plan.steps)
    assert TOKEN not in commands and "UV_EXTRA_INDEX_URL=<index URL, on stdin>" in commands
    card = run_card(
        CardView(
            run_id=7,
            plan=plan,
            requested_by="U0ALICE",
            status=RunStatus.PENDING_APPROVAL,
            steps=initial_steps(plan),
        )
    )
    text = str(card.blocks) + card.text
    assert TOKEN not in text and "ci-bot" not in text
    assert "`private` (pypi.private.example)" in text


async def test_the_wrapper_passes_any_url_verbatim_and_runs_none_of_it(tmp_path: Path) -> None:
    # Quotes, $(...) and backticks in a URL are data for the fixed script, never code.
    pwned = tmp_path / "pwned"
    hostile = f"https://u:p$(touch {pwned})`touch {pwned}`'\"@h.example/simple; touch {pwned}"
    r = await LocalTransport("local").run(
        (*remote.INDEX_FROM_STDIN, "printenv", remote.INDEX_ENV),
        timeout_s=10,
        stdin=remote.index_input(hostile),
    )
    assert (r.exit_status, r.stdout) == (0, hostile + "\n")
    assert not pwned.exists()


def _argvs_on_this_machine() -> dict[int, str]:
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                out[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                pass  # gone meanwhile
    return out


async def test_no_process_on_the_host_shows_the_token_and_uv_still_uses_the_index(
    sim_sshd_host: SimKit, tmp_path: Path
) -> None:
    kit = sim_sshd_host
    # The private index alone has this version, and only for these credentials.
    kit.update_config(index_url=PRIVATE, index_versions=(ONLY_ON_PRIVATE,))
    kit.set_faults(uv_stalls=True)  # hold the real install while the process list is read
    settings = sim_settings(kit, tmp_path, indexes={"private": PRIVATE})

    def stalled_install() -> int | None:
        for pid in procfs.with_env(STATE_DIR_ENV, str(kit.state_dir)):
            # The simulated uv is `python -S .../bot/sim/forkclient.py uv pip install ...`
            # (what the wrapper's exec became: the process that stands for uv, the one a
            # user of the host sees); `timeout` around it has the same argv after its own.
            argv = procfs.tool_argv(procfs.cmdline(pid)) or []
            if (
                argv[:3] == ["uv", "pip", "install"]
                and argv[-1:] == [f"vllm=={ONLY_ON_PRIVATE}"]
                and "--dry-run" not in argv
            ):
                return pid
        return None

    async with open_runtime(settings) as rt:
        running = asyncio.create_task(
            run(rt, Action.REDEPLOY, version=ONLY_ON_PRIVATE, index="private")
        )
        try:
            pid = await eventually(stalled_install, "the install running on the host")
            # What `ps -ef` shows every user of the host: no process carries the token.
            leaks = {p: a for p, a in _argvs_on_this_machine().items() if TOKEN in a}
            assert leaks == {}
            # uv has the index in its environment, which only its owner can read.
            environ = Path(f"/proc/{pid}/environ")
            assert f"{remote.INDEX_ENV}={PRIVATE}".encode() in environ.read_bytes().split(b"\0")
            assert stat.S_IMODE(os.stat(environ).st_mode) == 0o400
        finally:
            kit.set_faults(uv_stalls=False)
        result, out = await running
        assert result.status == "succeeded", out
        # Only the private index has this version: the install did use it.
        assert kit.installed_version == ONLY_ON_PRIVATE
        assert kit.changes() == ["dry-run", "prefetch", "stop", "install", "start"]
        assert all(TOKEN not in " ".join(c.argv) for c in kit.calls())
        assert TOKEN not in out
        steps = await rt.audit.steps(result.run_id)
        assert all(TOKEN not in s.command for s in steps)
        reinstall = next(s for s in steps if s.step == "reinstall")
        assert reinstall.command.startswith("UV_EXTRA_INDEX_URL=<index URL, on stdin> uv ")


async def test_the_simulated_uv_reads_its_index_from_the_environment_as_uv_does(
    sim_host: SimKit,
) -> None:
    sim_host.update_config(index_url=PRIVATE, index_versions=(ONLY_ON_PRIVATE,))

    async def dry_run(extra_env: dict[str, str], *flags: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            "uv",
            "pip",
            "install",
            "--python",
            str(sim_host.python),
            "--dry-run",
            *flags,
            f"vllm=={ONLY_ON_PRIVATE}",
            env={**sim_host.env(), **extra_env},
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, err.decode()

    assert (await dry_run({remote.INDEX_ENV: PRIVATE}))[0] == 0
    assert (await dry_run({"UV_INDEX_URL": PRIVATE}))[0] == 0
    code, err = await dry_run({})
    assert code == 1 and "there is no version of" in err
    # Other credentials are another index: the private versions are not found.
    assert (await dry_run({remote.INDEX_ENV: PRIVATE.replace(TOKEN, "wrong")}))[0] == 1
    # A flag wins over the variable, as with uv's own options.
    assert (
        await dry_run(
            {remote.INDEX_ENV: PRIVATE}, "--extra-index-url", "https://wheels.vllm.ai/nightly"
        )
    )[0] == 1


# ---- issue 17 F6: index tokens outside the URL's password ---------------------------------
#
# Real uv 0.13.9 output, captured here (tests/samples/SOURCES.md, section "frontends", says
# the exact commands): an index whose token is a path segment (Cloudsmith's shape), a query
# value, the user part with an empty password (Gemfury's `TOKEN:@`) and a 40-hex user with
# `x-oauth-basic` (GitHub's). Each configured URL below is the one the capture ran with.
SAMPLES = Path(__file__).parent / "samples"
PATH_TOKEN = "cs7Hq2Lm9Xw4Rt8Vb3Nk"
QUERY_TOKEN = "qT5mW8rZ2xK7vB4n"
USER_TOKEN = "fy8Kd3Qw7Zp2Lm5Xn9Rt"
HEX_TOKEN = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c"
CAPTURED = {
    "uv_index_path_token_refused.txt": (
        f"http://127.0.0.1:18942/{PATH_TOKEN}/acme/repo/python/simple/",
        PATH_TOKEN,
        "Failed to fetch: http://127.0.0.1:18942/***/acme/repo/python/simple/six/",
    ),
    "uv_index_query_token_refused.txt": (
        f"http://127.0.0.1:18942/acme/simple/?token={QUERY_TOKEN}",
        QUERY_TOKEN,
        "Failed to fetch: http://127.0.0.1:18942/acme/simple/six/?",
    ),
    "uv_index_user_token_401_vv.txt": (
        f"http://{USER_TOKEN}:@127.0.0.1:18941/fury/acme/",
        USER_TOKEN,
        "No password in cache for realm ***@http://127.0.0.1:18941",
    ),
    "uv_index_oauth_user_401_vv.txt": (
        f"http://{HEX_TOKEN}:x-oauth-basic@127.0.0.1:18941/basic/acme/simple/",
        HEX_TOKEN,
        "Read credentials for index `http://***:***@127.0.0.1:18941/basic/acme/simple/`",
    ),
}


def fragments(token: str, size: int = 6) -> set[str]:
    """Every piece of ``token`` long enough to give part of it away."""
    return {token[i : i + size] for i in range(len(token) - size + 1)}


def leaked(text: str, token: str) -> set[str]:
    return {f for f in fragments(token) if f in text}


def index_settings(url: str) -> Settings:
    return Settings(
        hosts={"h1": {"address": "10.0.0.1", "known_hosts": "/tmp/kh"}},
        services={"kimi": service(indexes={"leaky": url}).model_dump()},
    )


@pytest.mark.parametrize("sample", sorted(CAPTURED))
def test_real_uv_output_keeps_no_fragment_of_a_configured_index_token(sample: str) -> None:
    url, token, kept = CAPTURED[sample]
    text = (SAMPLES / sample).read_text()
    assert token in text  # uv does print it there
    out = Redactor.for_settings(index_settings(url))(text)
    assert leaked(out, token) == set(), out
    # The rest of uv's words stay: what failed, and where.
    assert kept in out, out
    assert out.count("\n") == text.count("\n")


def test_a_user_part_that_is_the_credential_is_masked_without_any_configuration() -> None:
    # The generic rule: whatever index the text names (one not in the config, a log of
    # another machine), a user part with an empty or placeholder password is the token.
    r = Redactor()
    assert (
        r(f"https://{HEX_TOKEN}:x-oauth-basic@github.com/acme/wheels")
        == "https://***:***@github.com/acme/wheels"
    )
    assert r(f"https://{USER_TOKEN}:@pypi.fury.io/acme/") == "https://***:@pypi.fury.io/acme/"
    assert r(f"git+https://{HEX_TOKEN}:x@github.com/a/b") == "git+https://***:***@github.com/a/b"
    # uv's own masking of the password leaves the user: that is masked too.
    line = (SAMPLES / "uv_index_oauth_user_401_vv.txt").read_text().splitlines()[10]
    assert HEX_TOKEN in line and leaked(r(line), HEX_TOKEN) == set()
    # A user with a real password is an account name and stays (its password goes).
    assert (
        r("https://ci-bot:pw-1234@pypi.example/simple") == "https://ci-bot:***@pypi.example/simple"
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://download.pytorch.org/whl/cu128",
        "https://flashinfer.ai/whl/cu124/torch2.6",
        "https://wheels.vllm.ai/nightly",
        "https://ci-bot:tok-9f8e7d6c5b4a@pypi.private.example/repository/pypi-remote/simple",
    ],
)
def test_a_public_or_ordinary_index_path_masks_nothing_of_uvs_output(url: str) -> None:
    # Good but unusual: public indexes' paths (cu128, torch2.6) are words, not tokens, so
    # configuring them masks nothing of a real install's output.
    text = (SAMPLES / "uv_pip_install_vllm_fresh.txt").read_text()
    assert Redactor.for_settings(index_settings(url))(text) == text
    assert (
        Redactor.for_settings(index_settings(url))(f"Downloading from {url}/torch/")
        == f"Downloading from {url.replace('tok-9f8e7d6c5b4a', '***')}/torch/"
    )


def test_an_index_token_of_no_known_shape_is_still_masked_where_it_sits() -> None:
    # Unknown must not count as safe: a short all-letters token is no "token shape", but
    # as the user part with an empty password, or a query value, it is the credential.
    for url, token in (
        ("https://abcdefgh:@pypi.fury.io/acme/", "abcdefgh"),
        ("https://idx.example/simple/?k=zzzzqqqq", "zzzzqqqq"),
    ):
        r = Redactor.for_settings(index_settings(url))
        assert token not in r(f"No password in cache for realm {token}@https://idx.example")
        assert token not in r(f"error: Failed to fetch: {url}six/")


class _GarbageIndex:
    """A package index on loopback that answers every page with JSON uv cannot read: uv
    fails at once naming the URL it fetched (`Received some unexpected JSON from ...`)."""

    async def __aenter__(self) -> int:
        async def page(request: web.Request) -> web.Response:
            return web.Response(
                body=b"{not json", content_type="application/vnd.pypi.simple.v1+json"
            )

        app = web.Application()
        app.router.add_get("/{tail:.*}", page)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return int(self.runner.addresses[0][1])

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


def _real_venv_with_vllm(tmp_path: Path, uv: str) -> Path:
    """A real venv (made by the real uv) whose metadata says vllm 0.31.0 is installed, so
    the real uv reads the version the preflight needs and goes on to the dry run."""
    venv = tmp_path / "real-venv"
    subprocess.run(
        [uv, "venv", "-q", "-p", sys.executable, str(venv)],
        check=True,
        env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")},
    )
    site = next((venv / "lib").glob("python3*/site-packages"))
    dist = site / "vllm-0.31.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.0\n")
    (dist / "RECORD").write_text("")
    (dist / "INSTALLER").write_text("uv\n")
    return venv / "bin" / "python"


def _audit_text(db: Path) -> str:
    """Every value the audit database holds, as SQLite itself gives it back."""
    with closing(sqlite3.connect(db)) as conn:
        return "\n".join(conn.iterdump())


async def test_a_real_uv_error_naming_the_token_reaches_no_slack_message_audit_row_or_log(
    tmp_path: Path, sim_host: SimKit
) -> None:
    # The host's uv is the real one (on PATH under ./dev), the index a loopback server
    # with the token in its path and its query: the dry run fails with uv's own words.
    uv = shutil.which("uv")
    assert uv is not None, "the real uv (./dev puts it on PATH)"
    python = _real_venv_with_vllm(tmp_path, uv)
    logged = io.StringIO()
    handler = logging.StreamHandler(logged)
    async with _GarbageIndex() as port:
        url = f"http://127.0.0.1:{port}/{PATH_TOKEN}/acme/repo/python/simple/?key={QUERY_TOKEN}"
        services = {
            SERVICE: sim_host.service_settings(uv=uv, python=str(python), indexes={"leaky": url})
        }
        async with slack_bot(tmp_path, sim_host, services=services) as bot:
            handler.addFilter(RedactingFilter(bot.runtime.redact))
            logging.getLogger().addHandler(handler)
            try:
                await bot.command(f"redeploy {SERVICE} --version 0.17.0 --index leaky --dry-run")
                record = await bot.wait_for_run(
                    lambda r: r.status == RunStatus.ABORTED, "the dry run refused", timeout_s=60
                )
                await bot.front_end.idle()
                # What the bot logs of a run goes through the same filter.
                logging.getLogger("bot.test").warning("dry run said: %s", record.summary)
            finally:
                logging.getLogger().removeHandler(handler)
            posted = [blocks_text(m) for m in bot.fake.messages(CHANNEL)]
            posted += [blocks_text(m) for m in await bot.thread(record.id)]
            posted += [e["text"] for e in bot.fake.ephemerals()]
    slack = "\n".join(posted)
    stored = _audit_text(tmp_path / "audit.db")
    # uv did say it, and it got through, masked.
    assert "Received some unexpected JSON from" in slack, slack
    assert "/***/acme/repo/python/simple/vllm/" in slack, slack
    for where, text in (("Slack", slack), ("audit DB", stored), ("log", logged.getvalue())):
        for token in (PATH_TOKEN, QUERY_TOKEN):
            assert leaked(text, token) == set(), (where, token)
    assert "Received some unexpected JSON" in stored
