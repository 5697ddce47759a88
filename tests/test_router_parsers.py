"""The router replies the bot judges (issue 19), parsed from real captures: HAProxy 2.6.12
(Debian 12's `haproxy` 2.6.12-1+deb12u4) through socat 1.7.4.4 on its admin socket, and
vLLM Router 0.1.17 (PyPI `vllm-router`) through curl, both on this project's CI image on
2026-12-02 in front of two loopback HTTP servers (tests/samples/SOURCES.md, "Issue 19").
Each judgement is tested both ways: a replica held out must never read as serving, and a
serving one must not read as out."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.routers import haproxy, vllm_router
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
        "# pxname,svname,qcur,qmax,scur,smax,slim,stot,status\n"
        "kimi,gpu1,0,0,3,5,,10,UP\n"
        "kimi,gpu2,0,0,0,1,,4,MAINT\n"
        "kimi,BACKEND,0,0,3,5,,14,UP\n"
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
    assert haproxy.rotation_of(status) == (rotation, up)


# ---- vLLM Router -----------------------------------------------------------------------

W1, W2 = "http://127.0.0.1:18001", "http://127.0.0.1:18002"


def test_workers_both_listed() -> None:
    status, body = http_reply("vr_workers_two.txt")
    read = vllm_router.parse_workers(status, body, [W1, W2])
    assert read.error is None
    for w in (W1, W2):
        v = read.of(w)
        assert (v.rotation, v.up, v.sessions) == (Rotation.IN, True, 0)


def test_workers_removed_one_is_out() -> None:
    status, body = http_reply("vr_workers_one_removed.txt")
    read = vllm_router.parse_workers(status, body, [W1, W2])
    assert read.of(W2).rotation == Rotation.OUT and read.of(W2).detail == "not listed"
    assert read.of(W1).rotation == Rotation.IN


def test_workers_trailing_slash_is_the_same_worker() -> None:
    status, body = http_reply("vr_workers_two.txt")
    assert vllm_router.parse_workers(status, body, [W1 + "/"]).of(W1 + "/").rotation == Rotation.IN


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
