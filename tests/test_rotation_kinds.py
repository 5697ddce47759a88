"""Rotation through HAProxy's Runtime API and the vLLM Router's admin API (issue 19), in
the pure flow: what the flow sends the router's host, in what order, and how it judges
the replies. The replies are the real routers' formats: ``show stat`` rows are built on
the header HAProxy 2.6.12 printed (tests/samples/routers/ha_show_stat.txt), the worker
list on vllm-router 0.1.17's ``GET /workers`` (vr_workers_two.txt). The real routers
themselves run in tests/test_rotation_e2e.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from bot.cli.terminal import TerminalSink
from bot.core import events as ev
from bot.core.flows import HttpCheck, RunCommand, redeploy_flow
from bot.core.phases.actions import RotationChange, RotationRecords
from bot.core.phases.rotation_ops import rotation_flow
from bot.core.plan import make_plan
from bot.core.privilege import Privilege
from bot.core.routers import haproxy_script, text
from bot.core.routers.target import router_target
from bot.core.status import Action
from bot.hosts.base import CommandResult, HttpResult
from bot.settings import Settings
from bot.slack.thread_blocks import rotation_reply
from tests.test_metrics_readiness import vllm_metrics
from tests.test_rotation_flow import rotations
from tests.test_rotation_flow import settings as command_settings
from tests.test_sequence import Host, drive, ok, steps, verbs

SAMPLES = Path(__file__).parent / "samples" / "routers"
HEADER = (SAMPLES / "ha_show_stat.txt").read_text().lstrip("\n").splitlines()[0]
COLUMNS = HEADER[2:].split(",")
SOCKET = "/run/haproxy/admin.sock"
ADMIN = "http://127.0.0.1:30080"
URLS = {"h1": "http://10.0.0.1:8000", "h2": "http://10.0.0.2:8000"}


def haproxy_settings(**svc: Any) -> Settings:
    return command_settings(
        router={
            "kind": "haproxy",
            "socket": SOCKET,
            "backend": "vllm_kimi",
            "drain": None,
            "undrain": None,
            "in_flight": None,
        },
        **svc,
    )


def vllm_router_settings(policy: str | None = None, **svc: Any) -> Settings:
    return command_settings(
        router={
            "kind": "vllm-router",
            "admin_url": ADMIN,
            "policy": policy,
            "drain": None,
            "undrain": None,
            "in_flight": None,
        },
        router_servers=URLS,
        **svc,
    )


def stat_row(backend: str, server: str, status: str, scur: int, weight: int = 1) -> str:
    row = dict.fromkeys(COLUMNS, "")
    row.update(
        pxname=backend, svname=server, status=status, scur=str(scur), qcur="0", weight=str(weight)
    )
    return ",".join(row[c] for c in COLUMNS)


@dataclass
class HAProxy:
    """The admin socket's side: each server's status and open sessions."""

    status: dict[str, str] = field(default_factory=lambda: {"node1": "UP", "node2": "UP"})
    # scur of node1 at each `show stat` after its drain (the last one repeats)
    scur: list[int] = field(default_factory=lambda: [3, 1, 0])
    refuse: dict[str, str] = field(default_factory=dict)  # state -> HAProxy's sentence
    said: list[str] = field(default_factory=list)
    weight: dict[str, int] = field(default_factory=dict)  # `set weight` by hand (else 1)
    # states it answers as taken (an empty line) and does not apply
    ignore: set[str] = field(default_factory=set)

    def answer(self, line: str) -> str:
        self.said.append(line)
        if line == "show stat":
            rows = [stat_row("fe", "FRONTEND", "OPEN", 0)]
            for server, status in self.status.items():
                n = 0
                if server == "node1" and status != "UP":
                    n = self.scur.pop(0) if len(self.scur) > 1 else self.scur[0]
                rows.append(stat_row("vllm_kimi", server, status, n, self.weight.get(server, 1)))
            rows.append(stat_row("vllm_kimi", "BACKEND", "UP", 0))
            return HEADER + "\n" + "\n".join(rows) + "\n\n"
        _, _, target, _, state = line.split(" ")
        backend, _, server = target.partition("/")
        if state in self.refuse:
            return self.refuse[state] + "\n\n"
        if backend != "vllm_kimi":
            return "No such backend.\n\n"
        if server not in self.status:
            return "No such server.\n\n"
        if state in self.ignore:
            return "\n"
        self.status[server] = {"ready": "UP", "drain": "DRAIN", "maint": "MAINT"}[state]
        return "\n"


@dataclass
class VllmRouter:
    """The admin API's side: the worker list, as add_worker and remove_worker leave it."""

    workers: list[str] = field(default_factory=lambda: list(URLS.values()))
    healthy: bool = True
    up: bool = True  # the admin API answers at all
    posts: list[str] = field(default_factory=list)
    dp: int = 1  # `--intra-node-data-parallel-size`: each worker listed once per rank
    load: int = 0
    ignores_removal: bool = False  # answers 200 "removed" and keeps routing to it

    def answer(self, a: HttpCheck) -> HttpResult:
        if not self.up:
            return HttpResult(a.url, None, error="connection refused")
        u = urlsplit(a.url)
        if u.path == "/workers":
            ranks = [f"{w}@{i}" for w in self.workers for i in range(self.dp)]
            listed = [
                {"url": u, "is_healthy": self.healthy, "load": self.load, "worker_type": "regular"}
                for u in (ranks if self.dp > 1 else self.workers)
            ]
            return HttpResult(a.url, 200, json.dumps({"workers": listed, "total": len(listed)}))
        assert a.method == "POST", a
        url = parse_qs(u.query)["url"][0]
        self.posts.append(f"{u.path} {url}")
        # As vllm-router 0.1.17: a URL is one exact spelling (no `/` stripped), and the
        # base URL stands for all its ranks.
        if u.path == "/remove_worker":
            if url in self.workers and not self.ignores_removal:
                self.workers.remove(url)
            return HttpResult(a.url, 200, f"Successfully removed worker: {url}")
        if url in self.workers:
            return HttpResult(a.url, 400, f"Worker {url} already exists")
        self.workers.append(url)
        return HttpResult(a.url, 200, f"Successfully added worker: {url}")


@dataclass
class LbHost(Host):
    haproxy: HAProxy = field(default_factory=HAProxy)
    vllm_router: VllmRouter = field(default_factory=VllmRouter)
    sibling_health: int = 200
    socat: list[RunCommand] = field(default_factory=list)

    def respond(self, action: Any) -> Any:
        if isinstance(action, RunCommand) and action.on == "lb-1":
            return self.lb(action)
        if isinstance(action, HttpCheck) and action.on == "lb-1":
            return self.vllm_router.answer(action)
        if isinstance(action, HttpCheck) and action.on is not None and action.on != "h1":
            return HttpResult(action.url, self.sibling_health)
        return super().respond(action)

    def lb(self, a: RunCommand) -> CommandResult:
        self.socat.append(a)
        # the bot's fixed script, its socat, socket and backend, then the command
        words = haproxy_script.words_of(a.argv)
        assert words is not None and a.argv[4:7] == ("/usr/bin/socat", SOCKET, "vllm_kimi")
        assert a.stdin is None
        return ok(a.argv, self.haproxy.answer(" ".join(words)))


def run(h: LbHost, s: Settings) -> Any:
    plan = make_plan(s, "redeploy", "kimi", version="0.16.0")  # type: ignore[arg-type]
    return drive(redeploy_flow(plan, s.services["kimi"], "h1"), h)


def haproxy_changes(h: LbHost) -> list[str]:
    return [line for line in h.haproxy.said if line != "show stat"]


# ---- haproxy ---------------------------------------------------------------------------


def test_haproxy_drain_until_no_session_then_maint_and_ready_after_the_redeploy() -> None:
    h = LbHost()
    out = run(h, haproxy_settings())
    assert out.status == "succeeded", out.summary
    assert haproxy_changes(h) == [
        "set server vllm_kimi/node1 state drain",
        "set server vllm_kimi/node1 state maint",
        "set server vllm_kimi/node1 state ready",
    ]
    said = h.haproxy.said
    # maint only once scur read 0: three reads after the drain (3, 1, 0)
    between = said[
        said.index("set server vllm_kimi/node1 state drain") + 1 : said.index(
            "set server vllm_kimi/node1 state maint"
        )
    ]
    assert between == ["show stat"] * 3
    # the socket is the router's, reached as root (sudo on a host that says so)
    assert {a.run_as for a in h.socat} == {Privilege.ROOT}
    # out before the stop, back after the start
    v = verbs(h)
    assert v.index("stop") < v.index("start")
    assert rotations(h) == [("out", "node1", True), ("in", "node1", True)]
    assert h.haproxy.status == {"node1": "UP", "node2": "UP"}


def test_haproxy_sibling_down_refuses_before_any_change() -> None:
    h = LbHost(haproxy=HAProxy(status={"node1": "UP", "node2": "DOWN"}))
    out = run(h, haproxy_settings())
    assert out.status == "aborted", out.summary
    assert "0 of 1 others serving" in out.summary and "DOWN" in out.summary
    assert haproxy_changes(h) == [] and "stop" not in verbs(h)


def test_haproxy_sibling_in_maint_counts_as_not_serving() -> None:
    h = LbHost(haproxy=HAProxy(status={"node1": "UP", "node2": "MAINT"}))
    out = run(h, haproxy_settings())
    assert out.status == "aborted" and haproxy_changes(h) == []


def test_haproxy_server_name_it_does_not_have_is_refused_not_serving() -> None:
    # router_servers names node2, HAProxy's backend has only node1 and node9
    h = LbHost(haproxy=HAProxy(status={"node1": "UP", "node9": "UP"}))
    out = run(h, haproxy_settings())
    assert out.status == "aborted"
    assert "backend vllm_kimi has no server node2" in out.summary
    assert haproxy_changes(h) == []


def test_haproxy_refused_drain_leaves_it_in_and_the_service_untouched() -> None:
    h = LbHost(haproxy=HAProxy(refuse={"drain": "Permission denied"}))
    out = run(h, haproxy_settings())
    assert out.status == "aborted", out.summary
    assert "state drain: Permission denied" in out.summary
    assert "stop" not in verbs(h)
    # the undo put it back as it was
    assert haproxy_changes(h)[-1] == "set server vllm_kimi/node1 state ready"


def test_haproxy_failed_redeploy_stays_in_maint() -> None:
    h = LbHost(install_fails=9)
    out = run(h, haproxy_settings())
    assert out.status != "succeeded"
    assert h.haproxy.status["node1"] == "MAINT"
    assert "ready" not in " ".join(haproxy_changes(h))
    assert "stays out of rotation" in out.summary and "/vllm undrain kimi h1" in out.summary


def test_haproxy_unreachable_socket_refuses() -> None:
    class Broken(LbHost):
        def lb(self, a: RunCommand) -> CommandResult:
            return ok(
                a.argv,
                stderr=f'socat[9] E connect(, AF=1 "{SOCKET}", 23): Permission denied',
                status=1,
            )

    out = run(Broken(), haproxy_settings())
    assert out.status == "aborted"
    assert "`show stat` to /run/haproxy/admin.sock on lb-1 failed (exit 1)" in out.summary
    assert "Permission denied" in out.summary


def test_haproxy_plan_lists_the_runtime_api_commands() -> None:
    t = router_target(haproxy_settings(), "kimi")
    assert t is not None
    through = f"on lb-1 (the bot's HAProxy script, /usr/bin/socat to {SOCKET})"
    assert text.shown_out(t, "node1") == (
        f"{through}: `set server vllm_kimi/node1 state drain`; `show stat` "
        "until its scur is 0; `set server vllm_kimi/node1 state maint`"
    )
    assert text.shown_in(t, "node1") == f"{through}: `set server vllm_kimi/node1 state ready`"


def test_haproxy_script_refusal_is_named_and_nothing_changes() -> None:
    # The script refuses a server name outside HAProxy's characters (a config written
    # before the settings checked it): the step names the refusal, the service untouched.
    class Refusing(LbHost):
        def lb(self, a: RunCommand) -> CommandResult:
            words = haproxy_script.words_of(a.argv)
            if words is not None and words[0] == "set":
                said = f"refused: not a server name: {words[2].split('/', 1)[1]}\n"
                return ok(a.argv, stderr=said, status=haproxy_script.REFUSED_EXIT)
            return super().lb(a)

    h = Refusing()
    out = run(h, haproxy_settings())
    assert out.status == "aborted", out.summary
    assert (
        "the bot's HAProxy script refused `set server vllm_kimi/node1 state drain` to "
        f"{SOCKET} on lb-1: refused: not a server name: node1"
    ) in out.summary
    assert haproxy_changes(h) == [] and "stop" not in verbs(h)
    # the audit log's rotations row: the change, not taken, with the script's words
    [change] = [n for n in h.notices if isinstance(n, RotationChange) and n.change == "out"]
    assert not change.ok and "refused: not a server name: node1" in change.detail


# ---- vllm-router -----------------------------------------------------------------------


def test_vllm_router_remove_then_add_after_the_redeploy() -> None:
    h = LbHost()
    out = run(h, vllm_router_settings())
    assert out.status == "succeeded", out.summary
    assert h.vllm_router.posts == [f"/remove_worker {URLS['h1']}", f"/add_worker {URLS['h1']}"]
    assert rotations(h) == [
        ("out", URLS["h1"], True),
        ("in", URLS["h1"], True),
    ]
    assert sorted(h.vllm_router.workers) == sorted(URLS.values())
    names = [s for s, _ in steps(h)]
    assert names.index("rotation_out") < names.index("requests") and names[-1] == "rotation_in"


def test_vllm_router_unreachable_refuses_before_any_change() -> None:
    h = LbHost(vllm_router=VllmRouter(up=False))
    out = run(h, vllm_router_settings())
    assert out.status == "aborted", out.summary
    assert "GET /workers: connection refused" in out.summary
    assert h.vllm_router.posts == [] and "stop" not in verbs(h)


def test_vllm_router_sibling_unhealthy_refuses() -> None:
    h = LbHost(vllm_router=VllmRouter(healthy=False))
    out = run(h, vllm_router_settings())
    assert out.status == "aborted" and h.vllm_router.posts == []
    assert "the router's health check says down" in out.summary


def test_vllm_router_sibling_already_removed_refuses() -> None:
    h = LbHost(vllm_router=VllmRouter(workers=[URLS["h1"]]))
    out = run(h, vllm_router_settings())
    assert out.status == "aborted" and h.vllm_router.posts == []


def test_vllm_router_failed_redeploy_stays_removed() -> None:
    h = LbHost(install_fails=9)
    out = run(h, vllm_router_settings())
    assert out.status != "succeeded"
    assert h.vllm_router.posts == [f"/remove_worker {URLS['h1']}"]
    assert URLS["h1"] not in h.vllm_router.workers


def test_vllm_router_plan_lists_the_admin_requests() -> None:
    t = router_target(vllm_router_settings(), "kimi")
    assert t is not None
    assert text.shown_out(t, URLS["h1"]) == (
        f"from lb-1: POST {ADMIN}/remove_worker?url=http%3A%2F%2F10.0.0.1%3A8000"
    )
    assert text.shown_in(t, URLS["h1"]) == (
        f"from lb-1: POST {ADMIN}/add_worker?url=http%3A%2F%2F10.0.0.1%3A8000"
    )


def test_haproxy_status_it_does_not_name_is_not_serving() -> None:
    # found by the review: an unrecognised status word read as UNKNOWN counted as serving
    h = LbHost(haproxy=HAProxy(status={"node1": "UP", "node2": "SOMETHING NEW"}))
    out = run(h, haproxy_settings())
    assert out.status == "aborted", out.summary
    assert "the router's state for it is unknown (SOMETHING NEW)" in out.summary
    assert haproxy_changes(h) == []


# ---- a replica out before the run, and a take-out the router did not make -------------


@pytest.mark.parametrize(
    ("status", "weight", "said"),
    [
        ("MAINT", 1, "MAINT"),
        ("DRAIN", 1, "DRAIN"),
        ("UP", 0, "UP, weight 0"),  # `set weight vllm_kimi/node1 0` by hand
    ],
)
def test_haproxy_server_out_by_hand_is_redeployed_and_left_as_it_was(
    status: str, weight: int, said: str
) -> None:
    """node1 out by the operator's hand: a `state drain` would lift its MAINT and the
    put-back would end it; the bot sends HAProxy nothing for it and leaves it out."""
    h = LbHost(haproxy=HAProxy(status={"node1": status, "node2": "UP"}, weight={"node1": weight}))
    out = run(h, haproxy_settings())
    assert out.status == "succeeded", out.summary
    assert haproxy_changes(h) == []
    assert h.haproxy.status["node1"] == status
    assert v_stop_start(h)
    assert f"held out of rotation by hand ({said}); left out" in out.summary
    assert rotations(h) == [("out", "node1", True)]
    assert "rotation_in" not in [s for s, _ in steps(h)]


@pytest.mark.parametrize(
    ("records", "said"),
    [
        # An earlier run took it out and never put it back (a redeploy that ended
        # unhealthy, a bot killed mid-roll): its rotations row says so.
        (RotationRecords({"node1": "run #7 took it out"}), "out of rotation (MAINT): run #7"),
        # The audit log cannot say: neither "by hand" nor a run is claimed.
        (RotationRecords({}, "database locked"), "who took it out is unknown: database locked"),
    ],
)
def test_a_replica_an_earlier_run_left_out_is_not_said_held_by_hand(
    records: RotationRecords, said: str
) -> None:
    h = LbHost(haproxy=HAProxy(status={"node1": "MAINT", "node2": "UP"}), records=records)
    out = run(h, haproxy_settings())
    assert out.status == "succeeded", out.summary
    assert haproxy_changes(h) == [] and h.haproxy.status["node1"] == "MAINT"
    assert said in out.summary and "by hand" not in out.summary, out.summary


@pytest.mark.parametrize("router", ["haproxy", "vllm-router"])
def test_a_replica_out_by_hand_stays_out_when_the_run_ends_before_the_stop(router: str) -> None:
    """Held out by hand (MAINT; a worker removed), and the run ends before the stop (its
    requests never drain): the service was never touched, yet the operator's decision
    stands. A put-back here would end their MAINT or add their worker back."""
    busy = vllm_metrics({"0": 2}, {"0": 0}, {"0": 0.3})
    h = LbHost(
        haproxy=HAProxy(status={"node1": "MAINT", "node2": "UP"}),
        vllm_router=VllmRouter(workers=[URLS["h2"]]),
        metrics=[busy],
    )
    s = (haproxy_settings if router == "haproxy" else vllm_router_settings)(
        request_drain_timeout_s=5
    )
    out = run(h, s)
    assert out.status == "aborted", out.summary
    assert "service untouched" in out.summary and verbs(h) == []
    assert "held out of rotation by hand" in out.summary and "left out" in out.summary
    assert haproxy_changes(h) == [] and h.vllm_router.posts == []
    assert h.haproxy.status["node1"] == "MAINT" and h.vllm_router.workers == [URLS["h2"]]
    assert "rotation_in" not in [s for s, _ in steps(h)]


def v_stop_start(h: LbHost) -> bool:
    v = verbs(h)
    return "stop" in v and "start" in v


def test_haproxy_sibling_of_weight_zero_is_not_serving() -> None:
    """node2 UP with weight 0 takes no request: taking node1 out would leave none."""
    h = LbHost(haproxy=HAProxy(weight={"node2": 0}))
    out = run(h, haproxy_settings())
    assert out.status == "aborted", out.summary
    assert "0 of 1 others serving" in out.summary and "UP, weight 0" in out.summary
    assert haproxy_changes(h) == [] and "stop" not in verbs(h)


def test_haproxy_drain_it_answers_but_does_not_make_is_refused_before_the_stop() -> None:
    """HAProxy answers the `state drain` as taken, yet `show stat` still shows node1 UP:
    the bot refuses before the stop, naming what it still shows."""
    h = LbHost(haproxy=HAProxy(ignore={"drain"}))
    out = run(h, haproxy_settings())
    assert out.status == "aborted", out.summary
    assert "the router still has node1 in (UP)" in out.summary
    assert "stop" not in verbs(h) and "service untouched" in out.summary
    assert rotations(h)[0] == ("out", "node1", False)


def test_haproxy_maint_it_answers_but_does_not_make_is_refused_before_the_stop() -> None:
    """The drain took, the sessions ended, and `state maint` is answered as taken, yet
    `show stat` still shows node1 DRAIN: a drained server still takes persistent
    (cookie, stick-table) connections, so the bot refuses before the stop, naming what
    HAProxy still shows, and puts it back."""
    h = LbHost(haproxy=HAProxy(ignore={"maint"}))
    out = run(h, haproxy_settings())
    assert out.status == "aborted", out.summary
    assert "the router still has node1 draining (DRAIN)" in out.summary
    assert "stop" not in verbs(h) and "service untouched" in out.summary
    assert haproxy_changes(h)[-1] == "set server vllm_kimi/node1 state ready"


def test_haproxy_ready_it_answers_but_does_not_make_is_not_called_back_in() -> None:
    """After a healthy redeploy HAProxy answers `state ready` as taken, yet `show stat`
    keeps node1 in MAINT: the run does not say it is back. It fails naming what HAProxy
    shows, and says how to put it back."""
    h = LbHost(haproxy=HAProxy(ignore={"ready"}))
    out = run(h, haproxy_settings())
    assert out.status == "failed", out.summary
    assert "not back in rotation: the router does not show node1 serving" in out.summary
    assert "(out, MAINT)" in out.summary and "/vllm undrain kimi h1" in out.summary
    assert v_stop_start(h) and h.haproxy.status["node1"] == "MAINT"
    assert rotations(h) == [("out", "node1", True), ("in", "node1", False)]


def test_haproxy_servers_named_by_address_and_port() -> None:
    servers = {"h1": "10.0.0.1:8000", "h2": "10.0.0.2:8000"}
    h = LbHost(haproxy=HAProxy(status={"10.0.0.1:8000": "UP", "10.0.0.2:8000": "UP"}))
    out = run(h, haproxy_settings(router_servers=servers))
    # the fake's scur sequence is node1's: this one is idle at once
    assert out.status == "succeeded", out.summary
    assert haproxy_changes(h) == [
        "set server vllm_kimi/10.0.0.1:8000 state drain",
        "set server vllm_kimi/10.0.0.1:8000 state maint",
        "set server vllm_kimi/10.0.0.1:8000 state ready",
    ]


@pytest.mark.parametrize("name", ["node1;show info", "node 1", "kimi/node1", "node1\nshow info"])
def test_haproxy_server_names_that_could_be_a_second_command_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not an HAProxy server name"):
        haproxy_settings(router_servers={"h1": name, "h2": "node2"})


def test_vllm_router_worker_listed_with_a_trailing_slash_is_changed_as_listed() -> None:
    """The router lists `http://10.0.0.1:8000/`, the config says `http://10.0.0.1:8000`:
    removed and added back under the router's spelling, listed once at the end."""
    listed = URLS["h1"] + "/"
    h = LbHost(vllm_router=VllmRouter(workers=[listed, URLS["h2"]]))
    out = run(h, vllm_router_settings())
    assert out.status == "succeeded", out.summary
    assert h.vllm_router.posts == [f"/remove_worker {listed}", f"/add_worker {listed}"]
    assert sorted(h.vllm_router.workers) == sorted([listed, URLS["h2"]])


def test_vllm_router_that_keeps_the_worker_is_refused_before_the_stop() -> None:
    """200 "Successfully removed worker" and still listed (what vllm-router does with a
    spelling it does not have): refused before the stop, naming what it lists, and no
    second copy added."""
    h = LbHost(vllm_router=VllmRouter(ignores_removal=True))
    out = run(h, vllm_router_settings())
    assert out.status == "aborted", out.summary
    assert f"the router still has {URLS['h1']} in (healthy)" in out.summary
    assert "stop" not in verbs(h)
    assert h.vllm_router.posts == [f"/remove_worker {URLS['h1']}"]
    assert h.vllm_router.workers == list(URLS.values())


def test_vllm_router_data_parallel_ranks_are_one_replica() -> None:
    """Each worker listed as `@0` and `@1`: the base URL is listed (min_serving passes),
    removed and added by its base URL (every rank), and confirmed gone."""
    h = LbHost(vllm_router=VllmRouter(dp=2))
    out = run(h, vllm_router_settings())
    assert out.status == "succeeded", out.summary
    assert h.vllm_router.posts == [f"/remove_worker {URLS['h1']}", f"/add_worker {URLS['h1']}"]
    assert sorted(h.vllm_router.workers) == sorted(URLS.values())


def test_vllm_router_worker_removed_by_hand_is_redeployed_and_not_added_back() -> None:
    h = LbHost(vllm_router=VllmRouter(workers=[URLS["h2"]]))
    out = run(h, vllm_router_settings(min_serving=1))
    assert out.status == "succeeded", out.summary
    assert h.vllm_router.posts == [] and h.vllm_router.workers == [URLS["h2"]]
    assert v_stop_start(h)
    assert "held out of rotation by hand (not listed); left out" in out.summary


@pytest.mark.parametrize(
    ("policy", "said"),
    [
        (None, "sessions not known"),
        ("round_robin", "sessions not known"),
        ("power_of_two", "3 session(s)"),
    ],
)
def test_vllm_router_load_is_sessions_only_under_a_policy_that_counts_them(
    policy: str | None, said: str
) -> None:
    """`load` 3 as the router reports it: only under power_of_two is it a count; unset
    or round_robin (where it stays 0 under load) it is not known, never "0 session(s)"."""
    s = vllm_router_settings(policy)
    h = LbHost(vllm_router=VllmRouter(load=3))
    plan = make_plan(s, Action.ROTATION, "kimi")
    out = drive(rotation_flow(plan, s.services["kimi"], "h1"), h)
    assert said in out.summary, out.summary


def test_a_replica_left_out_reads_as_such_in_the_thread_and_the_terminal() -> None:
    """The row of a replica held out by hand is no "out of rotation" the bot made."""
    said = "held out of rotation by hand (MAINT); left out"
    held = ev.RotationChanged(1, "h1", "front", "node1", "out", True, said, held=True)
    where = "(router front, server node1)"
    assert rotation_reply(held).text == f"h1: {said} {where}"
    assert TerminalSink._said(held) == f"[h1] {said} ({where[1:-1]})"
    # the bot's own take-out still reads as before
    made = ev.RotationChanged(1, "h1", "front", "node1", "out", True, "draining")
    assert rotation_reply(made).text == f"h1 out of rotation {where}"


def test_policy_is_the_vllm_routers_alone_and_one_it_has() -> None:
    t = router_target(vllm_router_settings("kv_aware"), "kimi")
    assert t is not None and t.policy == "kv_aware"
    with pytest.raises(ValueError, match="takes no policy"):
        command_settings(router={"policy": "round_robin"})
    with pytest.raises(ValueError, match="policy"):
        vllm_router_settings("least_busy")


def test_a_backend_name_with_a_trailing_newline_is_refused() -> None:
    """`$` in the name rule matched before a final newline: `vllm_kimi\n` passed, and
    would have split `set server` on the socket in two."""
    with pytest.raises(ValueError, match="is not a valid name"):
        command_settings(
            router={
                "kind": "haproxy",
                "socket": SOCKET,
                "backend": "vllm_kimi\n",
                "drain": None,
                "undrain": None,
                "in_flight": None,
            }
        )
