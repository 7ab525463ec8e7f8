"""The engine lifecycle: only the documented transitions, STOPPED is final."""

from __future__ import annotations

import itertools
import threading

import pytest

from tidemark.engine.state import EngineState, IllegalStateError, State

ORDER = list(State)


def _at(state: State) -> EngineState:
    machine = EngineState()
    for current, following in itertools.pairwise(ORDER):
        if current is state:
            break
        machine.transition(current, following)
    assert machine.current is state
    return machine


def test_the_happy_path() -> None:
    machine = EngineState()
    for current, following in itertools.pairwise(ORDER):
        machine.transition(current, following)
    assert machine.current is State.STOPPED


@pytest.mark.parametrize("start", ORDER)
@pytest.mark.parametrize("target", ORDER)
def test_only_allowed_transitions(start: State, target: State) -> None:
    machine = _at(start)
    index = ORDER.index(start)
    allowed = (target is ORDER[index + 1] if index + 1 < len(ORDER) else False) or (
        target is State.STOPPING and start in ORDER[:ORDER.index(State.STOPPING)])
    if allowed:
        machine.transition(start, target)
        assert machine.current is target
    else:
        with pytest.raises(IllegalStateError):
            machine.transition(start, target)
        assert machine.current is start


def test_transition_checks_the_expected_state() -> None:
    machine = EngineState()
    with pytest.raises(IllegalStateError, match="expected INITIALIZING"):
        machine.transition(State.INITIALIZING, State.CREATING_TASKS)


def test_stop_during_starting_tasks_is_deferred() -> None:
    machine = _at(State.STARTING_TASKS)
    assert machine.request_stop() is False and machine.stop_requested
    assert machine.current is State.STARTING_TASKS  # tasks finish starting first
    machine.transition(State.STARTING_TASKS, State.POLLING_TASKS)
    assert machine.request_stop() is True and machine.current is State.STOPPING


def test_stopped_is_final_and_calls_fail() -> None:
    machine = _at(State.STOPPED)
    assert machine.request_stop() is False
    with pytest.raises(IllegalStateError, match="new engine"):
        machine.require_running()


def test_wait_for_wakes_on_transition() -> None:
    machine = _at(State.POLLING_TASKS)
    timer = threading.Timer(0.05, machine.request_stop)
    timer.start()
    assert machine.wait_for(State.STOPPING, timeout_s=5)
    assert not machine.wait_for(State.STOPPED, timeout_s=0.01)
