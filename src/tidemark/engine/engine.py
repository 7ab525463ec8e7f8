"""The embedded engine: runs a connector's tasks and delivers their records.

    engine = Engine(connector, consumer=print_record,
                    config=EngineConfig(delivery_mode="per_key"),
                    offset_store=FileOffsetStore("offsets.json"))
    engine.run()          # blocks; close() from another thread (or a signal) stops it

Lifecycle (E2): CREATING → INITIALIZING → CREATING_TASKS → STARTING_TASKS →
POLLING_TASKS → STOPPING → STOPPED, through the one guarded setter of
:class:`EngineState`. Each task runs in a worker thread of its own; a task that fails
stops the others gracefully and :meth:`Engine.run` raises its error. A stop requested
while tasks are starting waits until every task has started or failed, so that nothing
a task opened (a replication slot, a connection) is left behind. Restart = a new engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from tidemark.engine.batch_delivery import BatchDelivery, LinesDelivery, OrderedDelivery
from tidemark.engine.config import DeliveryMode, EngineConfig, KeyBy
from tidemark.engine.consumers import (
    ChangeConsumer,
    JsonLinesConsumer,
    RecordConsumer,
    RecordProcessor,
)
from tidemark.engine.converters import Converter, DebeziumJsonConverter, converter_for_source
from tidemark.engine.delivery import (
    AsyncDelivery,
    Delivery,
    PerKeyDelivery,
    Pipeline,
    ProcessorDelivery,
)
from tidemark.engine.flow_control import CancelledError, Capacity, FailureHolder
from tidemark.engine.offset_tracker import OffsetTracker
from tidemark.engine.prerender import converted_records, offer_rendering, rendering_options
from tidemark.engine.state import EngineState, IllegalStateError, State
from tidemark.engine.task_runner import TaskRunner
from tidemark.engine.transforms import Transform
from tidemark.errors import ConfigError, SourceUnavailableError, TerminalError
from tidemark.offsets.memory import MemoryOffsetStore
from tidemark.offsets.store import Offset, OffsetStore, connect_store
from tidemark.source.capture_stats import CaptureStats
from tidemark.source.spi import SourceConnector, SourceTask, TaskConfig

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from tidemark.metrics import MetricsServer

log = logging.getLogger(__name__)
_T = TypeVar("_T")

Consumer = ChangeConsumer | JsonLinesConsumer | RecordConsumer | RecordProcessor


class EngineCallbacks(msgspec.Struct, frozen=True, kw_only=True):
    """Optional notifications of the connector's and tasks' lifecycle."""

    connector_started: Callable[[], None] | None = None
    connector_stopped: Callable[[], None] | None = None
    task_started: Callable[[int], None] | None = None
    task_stopped: Callable[[int], None] | None = None


class TaskTimeoutError(TerminalError):
    """A task did not start or stop within ``task_management_timeout_ms``."""


class Engine:
    """Runs a :class:`SourceConnector` and delivers its records to consumers.

    *consumer* is, by delivery mode: ``batch`` — an object with
    ``handle_batch(records, committer)`` (or ``handle_lines(lines, committer)``, a
    :class:`JsonLinesConsumer`); ``ordered``/``async``/``per_key`` — a callable
    taking one record; or a :class:`RecordProcessor` (any mode: it takes over). A list of
    consumers runs them in parallel on the same records; offsets are committed once all
    have processed a record (P3).
    """

    def __init__(self, connector: SourceConnector, consumer: Consumer | Sequence[Consumer], *,
                 config: EngineConfig | Mapping[str, Any] | None = None,
                 transforms: Sequence[Transform] = (),
                 converter: Converter | None = None,
                 offset_store: OffsetStore | None = None,
                 callbacks: EngineCallbacks | None = None) -> None:
        if config is None:
            config = EngineConfig()
        elif not isinstance(config, EngineConfig):
            config = EngineConfig.from_mapping(config)
        self.config = config
        self.connector = connector
        self._consumers = _consumer_list(consumer, config.delivery_mode)
        self._transforms = tuple(transforms)
        self._converter = converter_for_source(converter or DebeziumJsonConverter(),
                                               connector, self._transforms)
        if isinstance(self._consumers[0], JsonLinesConsumer) and \
                not isinstance(self._converter, DebeziumJsonConverter):
            raise ConfigError("converter", f"a JsonLinesConsumer takes Debezium JSON lines; "
                              f"{type(self._converter).__name__} does not write them (leave "
                              "the converter out, or give a DebeziumJsonConverter)")
        # A RecordProcessor gets the polled records themselves and may derive changed
        # events from them, which pre-rendered texts would no longer describe.
        self._rendering = (None if isinstance(self._consumers[0], RecordProcessor)
                           else rendering_options(self._converter, self._transforms))
        # A lines consumer takes the JSON lines a source writes, with nothing between
        # them to transform.
        self._lines = (isinstance(self._consumers[0], JsonLinesConsumer)
                       and self._rendering is not None and not self._transforms)
        self._converted_records = (self._rendering is not None and not self._lines
                                   and converted_records(self._converter, self._transforms,
                                                         config.delivery_mode))
        self._store = offset_store or MemoryOffsetStore()
        self._callbacks = callbacks or EngineCallbacks()
        self._state = EngineState()
        self._store_lock = threading.Lock()
        self._runners: list[TaskRunner] = []
        self._executors: list[ThreadPoolExecutor] = []
        self._wake = threading.Event()
        self._run_lock = threading.Lock()
        self._running = False
        self._metrics: MetricsServer | None = None
        # What outlived the stop (a consumer call still running): close() raises it.
        self._outlived: list[str] = []
        self.error: BaseException | None = None

    @property
    def state(self) -> State:
        return self._state.current

    @property
    def converter(self) -> Converter:
        """The converter in use, with what its options left to the source resolved (a
        log table's cells): its ``options`` are those a reader of its output needs."""
        return self._converter

    @property
    def metrics_port(self) -> int | None:
        """The port of the metrics endpoint while it is up (``metrics_port``)."""
        return None if self._metrics is None else self._metrics.port

    def _metric_families(self) -> Iterator[Metric]:
        from tidemark.metrics import queue_metrics  # noqa: PLC0415
        from tidemark.source.capture_metrics import capture_metrics  # noqa: PLC0415

        name = self.connector.name
        # Debezium's metrics label the source by its plugin; a connector may name its own.
        plugin = str(getattr(self.connector, "plugin", name))
        yield from queue_metrics(((str(r.index), r.capacity) for r in self._runners),
                                 name=name, plugin=plugin)
        for runner in self._runners:
            stats = getattr(getattr(runner.task, "connector", None), "stats", None)
            if isinstance(stats, CaptureStats):
                yield from capture_metrics(stats, name=name, plugin=plugin,
                                           extra={"task": str(runner.index)})

    @property
    def tasks(self) -> list[SourceTask]:
        """The tasks (once created)."""
        return [runner.task for runner in self._runners]

    # -- public lifecycle ------------------------------------------------------------
    def run(self) -> None:
        """Run until every task has finished, :meth:`close` is called, or a task fails
        (then its error is raised, after the other tasks have stopped)."""
        with self._run_lock:
            self._state.require_running()
            if self._running or self._state.current is not State.CREATING:
                raise IllegalStateError("the engine is already running; create a new one")
            self._running = True
        try:
            self._run()
        finally:
            self._shutdown()
        if self.error is not None:
            raise self.error

    def close(self, timeout_s: float | None = None) -> None:
        """Stop: drain in-flight records (``polling_shutdown_timeout_ms``), save offsets,
        stop the tasks (``task_management_timeout_ms``). Returns once STOPPED, when no
        consumer call runs any more nor will start; safe to call more than once.

        Raises :class:`TaskTimeoutError` if the engine is not STOPPED within *timeout_s*
        (default: the drain plus twice the task timeout, plus 5 s; close again to wait
        more), or, once, if it stopped while a poll or a consumer call was still running
        (one that blocked past ``task_management_timeout_ms``). From a consumer or a
        signal handler, use :meth:`request_stop`: close() there would wait for the call it
        is in."""
        self.request_stop()
        with self._run_lock:
            if not self._running:
                return
        if timeout_s is None:
            cfg = self.config
            timeout_s = (cfg.polling_shutdown_timeout_ms + 2 * cfg.task_management_timeout_ms
                         ) / 1000 + 5
        if not self._state.wait_for(State.STOPPED, timeout_s=timeout_s):
            raise TaskTimeoutError(
                f"the engine is {self._state.current.name}, not STOPPED, {timeout_s:g}s "
                "after close() (a consumer call or a task's poll or stop has not returned); "
                "close() again to wait longer (it stops within task_management_timeout_ms, "
                "leaving behind what has not returned by then), or give close() a longer "
                "timeout_s")
        # Said once: the engine is STOPPED, and what outlived it cannot be waited for;
        # a later close() (a with block's exit) returns as for any stopped engine.
        outlived, self._outlived = self._outlived, []
        if outlived:
            raise TaskTimeoutError(f"the engine is STOPPED, but {'; '.join(outlived)} "
                                   "(it stops by itself when that call returns)")

    def request_stop(self) -> bool:
        """Ask the engine to stop, as :meth:`close` does, and return at once: for a
        consumer (which runs on the engine's threads) or a signal handler. True if this
        call moved the engine towards STOPPED."""
        moved = self._state.request_stop()
        self._wake.set()
        for runner in self._runners:
            runner.stopping.set()
        with self._run_lock:
            running = self._running
        if not running and moved:  # never ran: nothing to wait for
            self._state.transition(State.STOPPING, State.STOPPED)
        return moved

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run_with_task(self, fn: Callable[[SourceTask], _T], timeout_s: float = 60) -> list[_T]:
        """Testing interface: once the tasks poll, call *fn* with each running task and
        return the results. Starts the engine in a background thread if it is not
        running yet; the engine keeps running (close it when done)."""
        with self._run_lock:
            running = self._running
        if not running and self._state.current is State.CREATING:
            threading.Thread(target=self._run_quietly, name="tidemark-engine",
                             daemon=True).start()
        if not self._state.wait_for(State.POLLING_TASKS, State.STOPPING, State.STOPPED,
                                    timeout_s=timeout_s):
            raise TaskTimeoutError(f"tasks were not polling within {timeout_s}s")
        if self._state.current is not State.POLLING_TASKS:
            raise IllegalStateError(f"engine is {self._state.current.name}, not polling"
                                    + (f": {self.error}" if self.error else ""))
        return [fn(runner.task) for runner in self._runners]

    def _run_quietly(self) -> None:
        try:
            self.run()
        except BaseException as err:  # kept in self.error for the test to read
            log.debug("engine stopped with %r", err)

    # -- the run ---------------------------------------------------------------------
    def _advance(self, expected: State, new: State) -> bool:
        """Move to *new*; False if a stop request got there first."""
        try:
            self._state.transition(expected, new)
            return True
        except IllegalStateError:
            if self._state.current is State.STOPPING:
                return False
            raise

    def _run(self) -> None:
        cfg = self.config
        try:
            if not self._advance(State.CREATING, State.INITIALIZING):
                return
            if cfg.metrics_port is not None:
                # Imported only when asked for: prometheus_client adds to every start.
                from tidemark.metrics import serve  # noqa: PLC0415

                self._metrics = serve(cfg.metrics_port, self._metric_families)
            task_configs = self.connector.task_configs(cfg.tasks_max)
            if not task_configs:
                raise ConfigError("tasks_max", f"connector {self.connector.name} has no work")
            if len(task_configs) > cfg.tasks_max:
                raise ConfigError("tasks_max", f"connector {self.connector.name} made "
                                  f"{len(task_configs)} tasks, more than tasks_max="
                                  f"{cfg.tasks_max}")
            self._connect_store()
            if self._callbacks.connector_started:
                self._callbacks.connector_started()
            if not self._advance(State.INITIALIZING, State.CREATING_TASKS):
                return
            self._runners = [self._runner(i, self._create_task(task_config))
                             for i, task_config in enumerate(task_configs)]
            if not self._advance(State.CREATING_TASKS, State.STARTING_TASKS):
                return
            self._start_tasks()
            if self._state.stop_requested:
                self._state.transition(State.STARTING_TASKS, State.STOPPING)
                return
            self._state.transition(State.STARTING_TASKS, State.POLLING_TASKS)
            self._poll_tasks()
        except BaseException as err:
            self.error = self.error or err

    def _connect_store(self) -> None:
        """Connect the offset store before any task starts: a configuration error stops
        the engine now, not at the first save after records were delivered; a server
        that is down is tolerated (saves are retried, loads may be served locally)."""
        try:
            connect_store(self._store)
        except SourceUnavailableError as err:
            log.warning("offset store %s is unreachable at start (%s); going on: offset "
                        "saves are retried until it is back", self._store, err)

    def _create_task(self, task_config: TaskConfig) -> SourceTask:
        task = self.connector.create_task(task_config)
        offer_rendering(task, self._rendering, records=self._converted_records,
                        lines=self._lines)
        return task

    def _runner(self, index: int, task: SourceTask) -> TaskRunner:
        def make_delivery(tracker: OffsetTracker[Offset], capacity: Capacity,
                          failure: FailureHolder) -> Delivery:
            return self._delivery(index, tracker, capacity, failure)
        return TaskRunner(index, task, self.config, self._store, self._store_lock,
                          make_delivery)

    def _delivery(self, index: int, tracker: OffsetTracker[Offset], capacity: Capacity,
                  failure: FailureHolder) -> Delivery:
        cfg = self.config
        workers = cfg.workers
        executor = ThreadPoolExecutor(workers, thread_name_prefix=f"tidemark-task{index}-worker")
        self._executors.append(executor)
        pipeline = Pipeline(self._transforms, self._converter, executor, workers)
        common: dict[str, Any] = {"pipeline": pipeline, "tracker": tracker,
                                  "capacity": capacity, "failure": failure,
                                  "name": f"tidemark-task{index}"}
        consumers: Any = self._consumers
        if isinstance(consumers[0], RecordProcessor):
            return ProcessorDelivery(consumers[0], executor, **common)
        mode = cfg.delivery_mode
        if mode is DeliveryMode.BATCH:
            if isinstance(consumers[0], JsonLinesConsumer):
                return LinesDelivery(consumers, read_ahead=cfg.read_ahead, **common)
            return BatchDelivery(consumers, read_ahead=cfg.read_ahead, **common)
        if mode is DeliveryMode.ORDERED:
            return OrderedDelivery(consumers, read_ahead=cfg.read_ahead, **common)
        if mode is DeliveryMode.ASYNC:
            return AsyncDelivery(consumers, executor, workers, **common)
        return PerKeyDelivery(consumers, workers, cfg.key_by is KeyBy.TABLE, **common)

    def _start_tasks(self) -> None:
        """Start every task in parallel and wait for all of them to finish starting
        (or failing), even when one fails early: a task still starting may be opening a
        slot, and stopping it half-way could leak it."""
        timeout_s = self.config.task_management_timeout_ms / 1000
        errors: list[BaseException] = []

        def start(runner: TaskRunner) -> None:
            try:
                runner.start(self._store)
                if self._callbacks.task_started:
                    self._callbacks.task_started(runner.index)
            except CancelledError:
                pass  # close() while it was retrying: not an error
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=start, args=(r,), name=f"tidemark-start{r.index}",
                                    daemon=True) for r in self._runners]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout_s)
            if thread.is_alive():
                errors.append(TaskTimeoutError(
                    f"a task did not start within task_management_timeout_ms="
                    f"{self.config.task_management_timeout_ms}"))
                break
        if errors:
            raise errors[0]

    def _poll_tasks(self) -> None:
        """Run each task's poll loop in its own worker until all finish, one fails, or
        a stop is requested."""
        def run(runner: TaskRunner) -> None:
            runner.run()
            self._wake.set()

        for runner in self._runners:
            runner.failure.changed = self._wake  # any task's failure wakes the engine
            runner.thread = threading.Thread(target=run, args=(runner,),
                                             name=f"tidemark-task{runner.index}", daemon=True)
            runner.thread.start()
        while True:
            self._wake.wait()
            self._wake.clear()
            for runner in self._runners:
                if runner.failure.error is not None:
                    failed = runner.failure.error
                    log.error("task %d failed: %s; stopping the other tasks", runner.index,
                              failed)
                    self.error = failed
                    return
            if self._state.current is not State.POLLING_TASKS:
                return  # close() was called
            if all(runner.finished for runner in self._runners):
                return

    def _shutdown(self) -> None:
        """STOPPING → STOPPED: drain, save offsets, stop tasks, release workers."""
        cfg = self.config
        if self._state.current is not State.STOPPING:
            self._state.request_stop()
            if self._state.current is State.STARTING_TASKS:
                self._state.transition(State.STARTING_TASKS, State.STOPPING)
        for runner in self._runners:
            runner.stopping.set()
        drain_s = 0.0 if self.error is not None else cfg.polling_shutdown_timeout_ms / 1000
        stoppers = []
        for runner in self._runners:
            thread = threading.Thread(target=self._stop_runner, args=(runner, drain_s),
                                      name=f"tidemark-stop{runner.index}", daemon=True)
            thread.start()
            stoppers.append(thread)
        for thread in stoppers:
            thread.join(drain_s + cfg.task_management_timeout_ms / 1000)
            if thread.is_alive():
                log.error("a task did not stop within task_management_timeout_ms=%d",
                          cfg.task_management_timeout_ms)
                self._outlived.append(f"a task (or its consumer) did not stop within "
                                      f"task_management_timeout_ms="
                                      f"{cfg.task_management_timeout_ms}")
        for executor in self._executors:
            executor.shutdown(wait=False, cancel_futures=True)
        if self._callbacks.connector_stopped and self._state.current is State.STOPPING:
            try:
                self._callbacks.connector_stopped()
            except Exception as err:
                log.warning("connector_stopped callback failed: %s", err)
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        self._state.transition(State.STOPPING, State.STOPPED)

    def _stop_runner(self, runner: TaskRunner, drain_s: float) -> None:
        # A task is not thread-safe: wait for its poll to return before the final
        # commit and stop (the SPI asks poll to return within about a second).
        timeout_s = self.config.task_management_timeout_ms / 1000
        deadline = time.monotonic() + drain_s + timeout_s  # as _shutdown waits for this
        if runner.thread is not None:
            runner.thread.join(timeout_s)
            if runner.thread.is_alive() and runner.abandon():
                log.error("task %d is still in poll() or its consumer after %.0fs; leaving "
                          "it to stop when it returns", runner.index, timeout_s)
                self._outlived.append(
                    f"task {runner.index}'s thread is still in poll() or a consumer call "
                    f"after task_management_timeout_ms={self.config.task_management_timeout_ms}")
                return
        if runner.started:
            runner.drain(drain_s)
        else:
            runner.delivery.close(discard=True)
        # No consumer call may run once the engine is STOPPED.
        if not runner.delivery.wait_closed(max(0.0, deadline - time.monotonic())):
            log.error("task %d: a consumer call is still running after %.0fs", runner.index,
                      timeout_s)
            self._outlived.append(
                f"task {runner.index}: a consumer call is still running after "
                f"task_management_timeout_ms={self.config.task_management_timeout_ms}")
        try:
            runner.task.stop()
        except Exception as err:
            log.warning("task %d did not stop cleanly: %s", runner.index, err)
        if runner.started and self._callbacks.task_stopped:
            self._callbacks.task_stopped(runner.index)


def _consumer_list(consumer: Consumer | Sequence[Consumer],
                   mode: DeliveryMode) -> list[Consumer]:
    consumers: list[Consumer] = (list(consumer) if isinstance(consumer, (list, tuple))
                                 else [consumer])  # type: ignore[list-item]
    if not consumers:
        raise ConfigError("consumer", "give at least one consumer")
    if any(isinstance(c, RecordProcessor) for c in consumers):
        if len(consumers) > 1:
            raise ConfigError("consumer", "a RecordProcessor takes over all processing; "
                              "give it alone")
        return consumers
    if mode is DeliveryMode.BATCH:
        for c in consumers:
            if not isinstance(c, (ChangeConsumer, JsonLinesConsumer)):
                raise ConfigError("delivery_mode", "'batch' needs consumers with "
                                  "handle_batch(records, committer) (or handle_lines(lines, "
                                  "committer)); for a function taking one record use "
                                  "'ordered', 'async' or 'per_key'")
        lines = [isinstance(c, JsonLinesConsumer) for c in consumers]
        if any(lines) and not all(lines):
            raise ConfigError("consumer", "consumers of one engine take records "
                              "(handle_batch) or JSON lines (handle_lines), not both")
    else:
        for c in consumers:
            if not callable(c):
                raise ConfigError("delivery_mode", f"{mode.value!r} needs callables taking "
                                  "one record; for handle_batch consumers use 'batch'")
    return consumers
