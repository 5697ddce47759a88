"""The approval card's sentence about the load (``bot.engine.load.load_note``): pure, from
each host's reading of ``/metrics``."""

from __future__ import annotations

from bot.core.metrics import Load
from bot.core.plan import Plan
from bot.core.status import Action
from bot.engine.load import Reading, load_note
from bot.settings import ServiceSettings


def plan(hosts: tuple[str, ...], *, force: bool = False) -> Plan:
    return Plan(
        action=Action.RESTART,
        service="kimi",
        hosts=hosts,
        unit="vllm",
        package="vllm",
        version=None,
        spec="vllm",
        index_name=None,
        index_url=None,
        steps=(),
        force=force,
    )


def service(**kw: object) -> ServiceSettings:
    return ServiceSettings(hosts=["h1"], unit="vllm", python="/opt/v/bin/python", **kw)


BUSY: dict[str, Reading] = {"h1": (Load(3, 1), ""), "h2": (Load(2, 0), ""), "h3": (Load(0, 0), "")}


def test_the_counts_are_summed_over_the_hosts_and_only_busy_ones_are_named() -> None:
    assert load_note(plan(("h1", "h2", "h3")), service(), BUSY) == (
        "Load now: h1: 3 running, 1 waiting requests; h2: 2 running, 0 waiting requests. "
        "the stop waits up to 300s for 6 request(s) to finish, else the run ends with the "
        "service untouched."
    )


def test_force_says_how_many_running_requests_it_will_interrupt() -> None:
    assert load_note(plan(("h1", "h2", "h3"), force=True), service(), BUSY).endswith(
        "--force: will interrupt 5 running requests (and 1 waiting); the stop does not wait."
    )
    one = {"h1": (Load(1, 0), "")}
    assert load_note(plan(("h1",), force=True), service(), one).endswith(
        "--force: will interrupt 1 running request; the stop does not wait."
    )


def test_a_zero_drain_timeout_says_the_requests_will_be_interrupted() -> None:
    note = load_note(plan(("h1", "h2", "h3")), service(request_drain_timeout_s=0), BUSY)
    assert note.endswith("request_drain_timeout_s = 0: 5 running request(s) will be interrupted.")
    assert "the stop waits" not in note


NO_GAUGES = "/metrics has no vllm:num_requests_running or vllm:num_requests_waiting"
REFUSED = (
    "unknown is not idle: the run stops it only if its unit is not running, else it "
    "ends with the service untouched; pass --force to stop anyway"
)


def test_a_host_whose_load_is_unknown_is_not_counted_as_idle() -> None:
    # Issue 17, D5: a server with --disable-log-stats answers /metrics without vllm:
    # gauges. The card says the stop will be refused there, not that it is idle.
    readings: dict[str, Reading] = {"h1": (None, NO_GAUGES), "h2": (None, "no answer within 3s")}
    note = load_note(plan(("h1", "h2")), service(), readings)
    assert note == (f"Load now: unknown on h1 ({NO_GAUGES}), h2 (no answer within 3s): {REFUSED}.")
    assert "idle" not in note.replace("not idle", "")
    # Next to a busy host: its requests are still waited for.
    readings["h3"] = (Load(2, 0), "")
    assert load_note(plan(("h1", "h2", "h3")), service(), readings) == (
        f"Load now: h3: 2 running, 0 waiting requests. load unknown on h1 ({NO_GAUGES}), "
        f"h2 (no answer within 3s): {REFUSED}. the stop waits up to 300s for 2 request(s) "
        "to finish, else the run ends with the service untouched."
    )


def test_force_or_a_zero_drain_timeout_say_the_unknown_load_is_interrupted() -> None:
    readings: dict[str, Reading] = {"h1": (None, NO_GAUGES)}
    assert load_note(plan(("h1",), force=True), service(), readings) == (
        f"Load now: unknown on h1 ({NO_GAUGES}): --force stops it anyway, interrupting "
        "whatever runs there."
    )
    assert load_note(plan(("h1",)), service(request_drain_timeout_s=0), readings) == (
        f"Load now: unknown on h1 ({NO_GAUGES}): request_drain_timeout_s = 0: the stop does "
        "not wait and interrupts whatever runs there."
    )


def test_idle_hosts_need_no_wait_and_many_busy_ones_are_cut() -> None:
    idle: dict[str, Reading] = {"h1": (Load(0, 0), ""), "h2": (Load(0, 0), "")}
    assert load_note(plan(("h1", "h2")), service(), idle) == (
        "Load now: no request in flight on 2 host(s)."
    )
    many: dict[str, Reading] = {f"h{i}": (Load(1, 0), "") for i in range(1, 6)}
    note = load_note(plan(tuple(many)), service(), many)
    assert note.startswith(
        "Load now: h1: 1 running, 0 waiting requests; h2: "
        "1 running, 0 waiting requests; h3: 1 running, 0 waiting "
        "requests; …. the stop waits up to 300s for 5 request(s)"
    )
