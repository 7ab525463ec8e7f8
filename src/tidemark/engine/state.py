"""The engine's lifecycle: states, the allowed transitions, and the one guarded setter.

CREATING → INITIALIZING → CREATING_TASKS → STARTING_TASKS → POLLING_TASKS → STOPPING →
STOPPED. Any state before STOPPING may go to STOPPING, except STARTING_TASKS: a task
that is starting holds a replication slot and connections, so a stop requested then
waits until every task has finished starting (or failing) — :meth:`EngineState.request_stop`
records the request and the engine honours it when it leaves STARTING_TASKS. STOPPED is
final.
"""

from __future__ import annotations

import threading
from enum import Enum
from typing import Final

from tidemark.errors import TerminalError


class State(Enum):
    """Engine states, in lifecycle order."""

    CREATING = "creating"
    INITIALIZING = "initializing"
    CREATING_TASKS = "creating_tasks"
    STARTING_TASKS = "starting_tasks"
    POLLING_TASKS = "polling_tasks"
    STOPPING = "stopping"
    STOPPED = "stopped"


_ALLOWED: Final[dict[State, frozenset[State]]] = {
    State.CREATING: frozenset({State.INITIALIZING, State.STOPPING}),
    State.INITIALIZING: frozenset({State.CREATING_TASKS, State.STOPPING}),
    State.CREATING_TASKS: frozenset({State.STARTING_TASKS, State.STOPPING}),
    State.STARTING_TASKS: frozenset({State.POLLING_TASKS, State.STOPPING}),
    State.POLLING_TASKS: frozenset({State.STOPPING}),
    State.STOPPING: frozenset({State.STOPPED}),
    State.STOPPED: frozenset(),
}


class IllegalStateError(TerminalError):
    """A transition the lifecycle does not allow, or a call on a stopped engine."""


class EngineState:
    """The current state, changed only through :meth:`transition`. Thread-safe."""

    def __init__(self) -> None:
        self._state = State.CREATING
        self._changed = threading.Condition()
        self._stop_requested = False

    @property
    def current(self) -> State:
        with self._changed:
            return self._state

    @property
    def stop_requested(self) -> bool:
        """A stop was requested while tasks were starting; honour it once they have."""
        with self._changed:
            return self._stop_requested

    def transition(self, expected: State, new: State) -> None:
        """Move from *expected* to *new*; fails if the state is not *expected* or the
        lifecycle does not allow the move."""
        with self._changed:
            if self._state is not expected:
                raise IllegalStateError(
                    f"engine is {self._state.name}, expected {expected.name} "
                    f"(moving to {new.name})"
                )
            if new not in _ALLOWED[expected]:
                raise IllegalStateError(f"engine cannot go from {expected.name} to {new.name}")
            self._state = new
            self._changed.notify_all()

    def request_stop(self) -> bool:
        """Move to STOPPING now if the lifecycle allows it (True), or, while tasks are
        starting, remember the request for later (False). Already stopping or stopped:
        False."""
        with self._changed:
            if self._state is State.STARTING_TASKS:
                self._stop_requested = True
                return False
            if State.STOPPING in _ALLOWED[self._state]:
                self._state = State.STOPPING
                self._changed.notify_all()
                return True
            return False

    def require_running(self) -> None:
        """Fail if the engine has stopped (STOPPED is final; restart = a new engine)."""
        with self._changed:
            if self._state in (State.STOPPING, State.STOPPED):
                raise IllegalStateError(
                    f"engine is {self._state.name}: create a new engine to run again"
                )

    def wait_for(self, *states: State, timeout_s: float | None = None) -> bool:
        """Block until the state is one of *states*; False if *timeout_s* ran out."""
        with self._changed:
            return self._changed.wait_for(lambda: self._state in states, timeout_s)
