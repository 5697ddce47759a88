"""The run's service state is its worst host's (bot.core.service_state.worst)."""

from bot.core.service_state import ServiceState, worst


def test_one_host_down_makes_the_run_down_whatever_the_others() -> None:
    assert (
        worst([ServiceState.UP, ServiceState.DOWN, ServiceState.UP_NOT_READY]) == ServiceState.DOWN
    )
    assert worst([ServiceState.UP, ServiceState.STOPPED]) == ServiceState.STOPPED


def test_all_up_is_up_and_nothing_known_is_unknown() -> None:
    assert worst([ServiceState.UP, ServiceState.UP]) == ServiceState.UP
    assert worst([ServiceState.UP, ServiceState.UP_NOT_READY]) == ServiceState.UP_NOT_READY
    assert worst([]) == ServiceState.UNKNOWN


def test_every_state_has_a_rank() -> None:
    for s in ServiceState:
        assert worst([s, ServiceState.UP]) == s
