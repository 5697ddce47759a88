"""The router replies the bot judges (issue 19), parsed from real captures: HAProxy 2.6.12
(Debian 12's `haproxy` 2.6.12-1+deb12u4) through socat 1.7.4.4 on its admin socket, and
vLLM Router 0.1.17 (PyPI `vllm-router`) through curl, both on this project's CI image on
2026-12-02 in front of two loopback HTTP servers (tests/samples/SOURCES.md, "Issue 19").
Each judgement is tested both ways: a replica held out must never read as serving, and a
serving one must not read as out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.core.routers import haproxy, haproxy_script, vllm_router
from bot.core.routers.view import Rotation

SAMPLES = Path(__file__).parent / "samples" / "routers"


def sample(name: str) -> str:
    return (SAMPLES / name).read_text()


def http_reply(name: str) -> tuple[int, str]:
    """A `curl -s -i` capture: its status code and its body."""
    head, _, body = sample(name).replace("\r\n", "\n").partition("\n\n")
    return int(head.split()[1]), body


# ---- HAProxy ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rotation", "up", "status"),
    [
        ("ha_show_stat.txt", Rotation.IN, True, "UP"),
        ("ha_show_stat_drain.txt", Rotation.DRAINING, None, "DRAIN"),
        ("ha_show_stat_maint.txt", Rotation.OUT, None, "MAINT"),
        # `state ready` after maint: up again, its fall counter not yet full
        ("ha_show_stat_ready.txt", Rotation.IN, True, "UP 1/3"),
        # its health check cannot connect: in rotation by admin state, but down
        ("ha_show_stat_down.txt", Rotation.IN, False, "DOWN"),
        # coming back up, checks passing but not yet `rise` of them
        ("ha_show_stat_rising.txt", Rotation.IN, False, "DOWN 1/2"),
    ],
)
def test_show_stat_states(name: str, rotation: Rotation, up: bool | None, status: str) -> None:
    views = haproxy.parse_show_stat(sample(name), "kimi")
    assert set(views) == {"gpu1", "gpu2"}  # FRONTEND and BACKEND rows are not servers
    v = views["gpu2"]
    assert (v.rotation, v.up, v.detail, v.sessions) == (rotation, up, status, 0)
    # the other server stayed as it was in every capture
    assert (views["gpu1"].rotation, views["gpu1"].up) == (Rotation.IN, True)


def test_show_stat_other_backend_lists_nothing() -> None:
    assert haproxy.parse_show_stat(sample("ha_show_stat.txt"), "other") == {}


def test_show_stat_columns_found_by_name_not_position() -> None:
    """HAProxy added columns over the versions (1.5 had 62, 2.6 has 100+): an older,
    shorter header with the fields in its own places still reads."""
    text = (
        "# pxname,svname,qcur,qmax,scur,smax,slim,stot,status,weight\n"
        "kimi,gpu1,0,0,3,5,,10,UP,1\n"
        "kimi,gpu2,0,0,0,1,,4,MAINT,1\n"
        "kimi,BACKEND,0,0,3,5,,14,UP,1\n"
    )
    views = haproxy.parse_show_stat(text, "kimi")
    assert views["gpu1"].sessions == 3 and views["gpu1"].rotation == Rotation.IN
    assert views["gpu2"].rotation == Rotation.OUT


@pytest.mark.parametrize(
    "reply",
    [
        sample("ha_set_unknown_backend.txt"),  # what a wrong command gets back
        "",  # socat got nothing (HAProxy closed the socket)
        "Unknown command. Please enter one of the following commands only :\n  help\n",
        "# pxname,svname,status\nkimi,gpu1,UP\n",  # no scur column
        # no weight column: an UP server of weight 0 serves nothing
        "# pxname,svname,scur,status\nkimi,gpu1,0,UP\n",
    ],
)
def test_show_stat_refuses_what_is_not_show_stat(reply: str) -> None:
    with pytest.raises(ValueError, match="show stat"):
        haproxy.parse_show_stat(reply, "kimi")


def test_set_server_answers() -> None:
    # taken: one empty line; refused: a sentence, with socat's exit still 0
    assert haproxy.parse_answer(sample("ha_set_maint.txt")) is None
    assert haproxy.parse_answer(sample("ha_set_unknown_server.txt")) == "No such server."
    assert haproxy.parse_answer(sample("ha_set_unknown_backend.txt")) == "No such backend."


@pytest.mark.parametrize(
    ("status", "rotation", "up"),
    [
        ("no check", Rotation.IN, None),
        ("NOLB", Rotation.DRAINING, None),
        ("DRAIN (agent)", Rotation.DRAINING, None),
        ("MAINT (via kimi/gpu1)", Rotation.OUT, None),
        ("MAINT (resolution)", Rotation.OUT, None),
        ("", Rotation.UNKNOWN, None),
    ],
)
def test_status_words_haproxy_prints(status: str, rotation: Rotation, up: bool | None) -> None:
    # the words of HAProxy 2.6's stats.c (srv_hlt_st) not in the captures above
    assert haproxy.rotation_of(status, 1) == (rotation, up)


def test_weight_zero_is_draining_not_serving() -> None:
    """`set weight kimi/gpu2 0` (ha_show_stat_weight0.txt): HAProxy keeps its status
    `UP` and sends it nothing; it must never count as serving."""
    views = haproxy.parse_show_stat(sample("ha_show_stat_weight0.txt"), "kimi")
    v = views["gpu2"]
    assert (v.rotation, v.up, v.detail) == (Rotation.DRAINING, True, "UP, weight 0")
    # the other server, weight 1, serves as before
    assert (views["gpu1"].rotation, views["gpu1"].detail) == (Rotation.IN, "UP")


def test_weight_unreadable_is_unknown_not_serving() -> None:
    """The real reply with gpu1's weight field emptied: no proof it takes requests."""
    lines = sample("ha_show_stat.txt").lstrip("\n").splitlines()
    at = lines[0][2:].split(",").index("weight")
    rows = [ln.split(",") for ln in lines[1:]]
    for row in rows:
        if row[:2] == ["kimi", "gpu1"]:
            row[at] = ""
    text = "\n".join([lines[0], *(",".join(r) for r in rows)])
    views = haproxy.parse_show_stat(text, "kimi")
    assert (views["gpu1"].rotation, views["gpu1"].detail) == (
        Rotation.UNKNOWN,
        "UP, weight unknown",
    )
    assert views["gpu2"].rotation == Rotation.IN


def test_server_named_by_address_and_port() -> None:
    """HAProxy names a server `10.0.0.5:8000` (haproxy_capture_colon.cfg): the real
    HAProxy takes `set server colon/10.0.0.5:8000 state drain` (one empty line) and
    shows it DRAIN."""
    name = "10.0.0.5:8000"
    assert haproxy.valid_server_name(name)
    words = haproxy_script.set_state_words("colon", name, "drain")
    assert " ".join(words) == "set server colon/10.0.0.5:8000 state drain"
    assert haproxy.parse_answer(sample("ha_set_colon_drain.txt")) is None
    views = haproxy.parse_show_stat(sample("ha_show_stat_colon_drain.txt"), "colon")
    assert views[name].rotation == Rotation.DRAINING and views["gpu2"].rotation == Rotation.IN


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("gpu1", True),
        ("10.0.0.5:8000", True),
        ("node-1.rack_2", True),
        ("srv1", True),  # what `server-template srv 1-3` names them
        ("a;show info", False),  # `;` separates HAProxy commands (it ran `show info`)
        ("a b", False),
        ("gpu1\n", False),
        ("gpu1\nshow info", False),
        ("kimi/gpu1", False),
        ("", False),
        (":8000", False),
        ("-x", False),
    ],
)
def test_server_names_that_may_reach_the_socket(name: str, ok: bool) -> None:
    assert haproxy.valid_server_name(name) is ok


# ---- vLLM Router -----------------------------------------------------------------------

W1, W2 = "http://127.0.0.1:18001", "http://127.0.0.1:18002"


def test_workers_both_listed() -> None:
    status, body = http_reply("vr_workers_two.txt")
    read = vllm_router.parse_workers(status, body, [W1, W2], policy="cache_aware")
    assert read.error is None
    for w in (W1, W2):
        v = read.of(w)
        assert (v.rotation, v.up, v.sessions, v.names) == (Rotation.IN, True, 0, (w,))


def test_workers_removed_one_is_out() -> None:
    status, body = http_reply("vr_workers_one_removed.txt")
    read = vllm_router.parse_workers(status, body, [W1, W2])
    assert read.of(W2).rotation == Rotation.OUT and read.of(W2).detail == "not listed"
    assert read.of(W1).rotation == Rotation.IN


def test_workers_trailing_slash_is_the_same_worker() -> None:
    status, body = http_reply("vr_workers_two.txt")
    v = vllm_router.parse_workers(status, body, [W1 + "/"]).of(W1 + "/")
    # found, and named as the router has it: what a change must send
    assert (v.rotation, v.names) == (Rotation.IN, (W1,))


def test_worker_listed_with_a_trailing_slash_is_named_as_listed() -> None:
    """A router given `http://127.0.0.1:18001/` keeps that spelling, and
    `remove_worker?url=http://127.0.0.1:18001` left it listed (vr_workers_slash.txt,
    read after that 200 "Successfully removed worker", vr_remove_other_spelling.txt)."""
    assert (
        vllm_router.parse_change(*http_reply("vr_remove_other_spelling.txt"), None, add=False)
        is None
    )
    status, body = http_reply("vr_workers_slash.txt")
    v = vllm_router.parse_workers(status, body, [W1]).of(W1)
    assert (v.rotation, v.up, v.names) == (Rotation.IN, True, (W1 + "/",))
    assert v.detail == f"healthy, as {W1}/"


def test_worker_listed_twice_is_one_replica_with_both_names() -> None:
    """add_worker of `http://127.0.0.1:18001` beside `.../18001/` listed it twice
    (vr_workers_listed_twice.txt): both are the one replica, each to be removed."""
    status, body = http_reply("vr_workers_listed_twice.txt")
    v = vllm_router.parse_workers(status, body, [W1]).of(W1)
    assert v.rotation == Rotation.IN and set(v.names) == {W1, W1 + "/"}


def test_data_parallel_ranks_are_the_configured_worker() -> None:
    """`--intra-node-data-parallel-size 2` lists `http://h:p@0` and `@1`
    (vr_workers_dp.txt): the base URL is listed, healthy, named by its base."""
    status, body = http_reply("vr_workers_dp.txt")
    read = vllm_router.parse_workers(status, body, [W1, W2])
    for w in (W1, W2):
        v = read.of(w)
        assert (v.rotation, v.up, v.names, v.detail) == (
            Rotation.IN,
            True,
            (w,),
            "healthy, 2 ranks",
        )


def test_data_parallel_load_is_the_sum_of_the_ranks() -> None:
    """Six requests in flight under power_of_two (vr_workers_dp_inflight.txt): :18001's
    ranks hold 2 + 2, :18002's 2 + 0."""
    status, body = http_reply("vr_workers_dp_inflight.txt")
    read = vllm_router.parse_workers(status, body, [W1, W2], policy="power_of_two")
    assert (read.of(W1).sessions, read.of(W2).sessions) == (4, 2)


def test_data_parallel_worker_is_up_only_when_every_rank_is() -> None:
    """The real list with one rank of :18002 marked unhealthy: the replica is down."""
    status, body = http_reply("vr_workers_dp.txt")
    listed = json.loads(body)
    for w in listed["workers"]:
        if w["url"] == W2 + "@1":
            w["is_healthy"] = False
    read = vllm_router.parse_workers(status, json.dumps(listed), [W1, W2])
    assert read.of(W2).up is False and read.of(W2).rotation == Rotation.IN
    assert read.of(W1).up is True


def test_data_parallel_worker_removed_by_its_base_url_is_out() -> None:
    """remove_worker?url=http://127.0.0.1:18002 removed both its ranks
    (vr_dp_remove_base.txt, then vr_workers_dp_removed.txt)."""
    assert vllm_router.parse_change(*http_reply("vr_dp_remove_base.txt"), None, add=False) is None
    status, body = http_reply("vr_workers_dp_removed.txt")
    read = vllm_router.parse_workers(status, body, [W1, W2])
    assert read.of(W2).rotation == Rotation.OUT and read.of(W1).rotation == Rotation.IN


@pytest.mark.parametrize(
    ("policy", "counted"),
    [
        ("round_robin", False),
        ("random", False),
        ("consistent_hash", False),
        ("sticky_least_loaded", False),
        ("cache_aware", True),
        ("power_of_two", True),
        ("kv_aware", True),
    ],
)
def test_load_is_a_count_only_under_the_policies_that_keep_it(policy: str, counted: bool) -> None:
    """Four requests in flight through a router of each policy
    (vr_workers_inflight_<policy>.txt): only three count them in `load`; under the others
    it reads 0, which must not pass for "no session"."""
    status, body = http_reply(f"vr_workers_inflight_{policy}.txt")
    read = vllm_router.parse_workers(status, body, [W1, W2], policy=policy)
    sessions = [read.of(w).sessions for w in (W1, W2)]
    if counted:
        assert sum(s or 0 for s in sessions) == 4
    else:
        assert sessions == [None, None]
    # with no policy configured, never a count
    unset = vllm_router.parse_workers(status, body, [W1, W2])
    assert [unset.of(w).sessions for w in (W1, W2)] == [None, None]


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (None, "", "connection refused"),
        (404, "Not Found", None),
        *[(200, b, None) for b in ("", "{}", '{"urls": []}', "[1]")],
        # /list_workers' shape is not /workers'
        (200, http_reply("vr_list_workers.txt")[1], None),
    ],
)
def test_workers_unreadable_is_an_error_not_out(
    status: int | None, body: str, error: str | None
) -> None:
    read = vllm_router.parse_workers(status, body, [W1], error)
    assert read.error is not None and read.error.startswith("GET /workers")
    assert read.servers == {}


def test_worker_changes() -> None:
    assert vllm_router.parse_change(*http_reply("vr_remove_ok.txt"), None, add=False) is None
    assert vllm_router.parse_change(*http_reply("vr_add_ok.txt"), None, add=True) is None
    # putting back a worker the router already has is the state wanted
    assert vllm_router.parse_change(*http_reply("vr_add_exists.txt"), None, add=True) is None
    # ... with data-parallel ranks, every rank already there (vr_dp_add_exists.txt)
    assert vllm_router.parse_change(*http_reply("vr_dp_add_exists.txt"), None, add=True) is None
    assert (
        vllm_router.parse_change(*http_reply("vr_dp_add_exists.txt"), None, add=False) is not None
    )
    # ... but the same words never make a removal look done
    assert vllm_router.parse_change(*http_reply("vr_add_exists.txt"), None, add=False) is not None
    status, body = http_reply("vr_add_unhealthy_timeout.txt")
    said = vllm_router.parse_change(status, body, None, add=True)
    assert said is not None and said.startswith("HTTP 400: Timeout 600s")
    assert vllm_router.parse_change(None, "", "timed out", add=True) == "timed out"


def test_worker_url_is_one_parameter() -> None:
    url = vllm_router.add_worker_url("http://127.0.0.1:30080/", "http://10.0.0.1:8000/v1?x=1&y#z")
    assert url == (
        "http://127.0.0.1:30080/add_worker?url=http%3A%2F%2F10.0.0.1%3A8000%2Fv1%3Fx%3D1%26y%23z"
    )
