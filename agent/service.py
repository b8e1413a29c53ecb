"""The per-node agent: samples its collectors on a monotonic 1 Hz schedule, closes a window every
``publish_interval`` and hands it to the MQTT link; on shutdown the open window is published, not lost."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import socket
import time
from collections.abc import Callable, Sequence

from agent import __version__
from agent.clock import Clock
from agent.config import AgentConfig, AgentSettings
from agent.heap import trim
from agent.metrics import Family, MetricsServer, counter, gauge, labelled
from agent.mqtt import Link, stop_tasks
from agent.notify import Notifier
from agent.pacing import Pacer
from agent.protocol import Birth, Telemetry, WorkloadRef, encode
from agent.spool import DiskSpool, MemoryQueue, WindowQueue
from agent.window import WindowBuilder
from agent.worker import Worker, WorkerBusy, abandon
from collectors.base import Collector, Inventory, Sample

log = logging.getLogger(__name__)

# The exit status when a collector can read its hardware again only from a new process (EX_TEMPFAIL): the unit's
# Restart=on-failure starts it again, within its start limit.
EXIT_RESTART = 75
# Windows closed before the memory start-up freed is handed back: by the second, the first models are built and
# the first TCP tables read.
SETTLED_WINDOWS = 2
# Share of a sampling interval a collector's sample may take on its thread; a later answer is dropped and counted,
# so one slow device never holds the others' samples back.
SAMPLE_DEADLINE = 0.8
# Real seconds a collector's inventory, workloads (once per window: /proc scans, process lists) or close may take.
CALL_DEADLINE_S = 5.0
# Without a watchdog, a collector call running this long is still reported as stuck (log line, metric).
STUCK_S = 30.0
OVERRUN_LOG_S = 60.0  # at most one line per collector per minute about skipped samples


def open_spool(settings: AgentSettings) -> WindowQueue:
    """The disk spool under ``state_dir``; a queue in memory where the directory cannot be used (read-only, not
    a directory, no permission), so that the agent still samples and publishes."""
    directory = settings.state_dir / "spool"
    try:
        return DiskSpool(
            directory,
            settings.spool_max_windows,
            int(settings.spool_max_mb * 2**20),
            int(settings.sent_keep_mb * 2**20),
        )
    except OSError as exc:
        log.error(
            "cannot use the spool in %s (%s); windows are held in memory and lost on a restart",
            directory,
            exc.strerror or exc,
        )
        # the same bound in bytes as the spool it stands in for
        return MemoryQueue(settings.spool_max_windows, keep_sent=360, max_bytes=int(settings.spool_max_mb * 2**20))


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        collectors: Sequence[Collector],
        session: int,
        clock: Clock | None = None,
        hostname: str | None = None,
        queue: WindowQueue | None = None,
        notifier: Notifier | None = None,
    ) -> None:
        self.config = config
        self.settings = config.agent
        self.collectors = list(collectors)
        self.session = session
        self.clock = clock or Clock()
        self.hostname = hostname or socket.gethostname()
        self.builder = WindowBuilder(self.settings.node, self.settings.site, session)
        self.queue = queue if queue is not None else open_spool(self.settings)
        # the bucket outlives a restart where the spool does: a restart loop must not hand out a fresh burst each time
        pacing = self.queue.directory.parent / "pacing.json" if isinstance(self.queue, DiskSpool) else None
        self.pacer = Pacer(self.settings.pace, self.settings.publish_burst, self.clock, pacing)
        self.link = Link(
            config.mqtt,
            self.settings.site,
            self.settings.node,
            session,
            self.birth,
            self.queue,
            self.clock.wall,
            self.pacer,
        )
        self.notifier = notifier or Notifier(environ={})
        self.should_exit = asyncio.Event()
        self.on_window: Callable[[Telemetry], None] | None = None
        self.seq = 0
        self.windows_closed = 0
        self.ticks_missed = 0
        self.collector_errors = 0
        self.samples_taken = 0
        self.exit_code = 0  # what `fleetfit agent` exits with
        self.metrics = (
            MetricsServer(self.settings.metrics_listen, self.settings.metrics_port, self.self_metrics)
            if self.settings.metrics_port is not None
            else None
        )
        self._inventory: Inventory | None = None
        self._parts: list[Inventory] = [Inventory() for _ in self.collectors]  # each collector's, last answered
        self._failing: set[str] = set()
        # A thread of its own for each collector whose calls can block (vendor C libraries, filesystems); the
        # others (simulated nodes) are called on the loop, as cheap as before.
        self._workers = [Worker(c.name) if getattr(c, "blocking", False) else None for c in self.collectors]
        self.overruns: dict[str, int] = {}  # samples skipped because a collector did not answer in time, by name
        self._overrun_told: dict[str, tuple[float, int]] = {}  # by name: when last logged, the count then
        self.stuck: str | None = None  # the collector whose call has not returned for the watchdog's period
        self._window_start = self.clock.wall()
        self._generation = sum(getattr(c, "generation", 0) for c in self.collectors)
        self._link_task: asyncio.Task[None] | None = None
        self.link_died: str | None = None  # why the link task ended (it never should): the watchdog stops

    # ------------------------------------------------------------------ collection

    def inventory(self) -> Inventory:
        if self._inventory is None:
            merged = Inventory()
            for c in self.collectors:
                try:
                    merged = merged.merge(c.inventory())
                except Exception:
                    log.exception("collector %s failed to report its inventory", c.name)
            self._inventory = merged
        return self._inventory

    def birth(self) -> Birth:
        inv = self.inventory()
        return Birth(
            node=self.settings.node,
            site=self.settings.site,
            session=self.session,
            agent_version=__version__,
            hostname=self.hostname,
            timestamp=self.clock.wall(),
            gpus=inv.gpus,
            gpu_unavailable=inv.gpu_unavailable,
            nics=inv.nics,
            disks=inv.disks,
            driver_version=inv.driver_version,
            cuda_version=inv.cuda_version,
            gpu_failures=inv.gpu_failures,
            attribution_warning=inv.attribution_warning,
            host=inv.host,
        )

    def tick(self) -> None:
        """Sample every collector once, here and now (``fleetfit agent --once``); the daemon samples on worker
        threads (:meth:`sample_all`). A failing collector is logged once and skipped, never fatal."""
        samples: list[Sample] = []
        for c in self.collectors:
            try:
                samples.extend(self._answered(c, c.sample()))
            except Exception as exc:
                self._failed(c, exc)
        if self._absorb(samples):
            self._inventory = None
            self.link.republish_birth()

    async def sample_all(self) -> None:
        """Sample every collector once, each that can block on its own thread, all within ``SAMPLE_DEADLINE`` of
        an interval: a collector that has not answered by then, or whose previous call has not returned, is
        skipped this round and counted; the others' samples are taken."""
        deadline = self.settings.sample_interval * SAMPLE_DEADLINE / self.clock.scale
        # Futures and one wait, not a task per collector: this runs every second on every node.
        started: list[tuple[Collector, asyncio.Future[list[Sample]]]] = []
        for c, worker in zip(self.collectors, self._workers, strict=True):
            if worker is None:
                continue
            try:
                started.append((c, worker.submit(c.sample)))
            except WorkerBusy as exc:
                self._overran(c.name, str(exc))
        samples: list[Sample] = []
        for c, worker in zip(self.collectors, self._workers, strict=True):
            if worker is None:  # called on the loop while the others run on their threads
                try:
                    samples.extend(self._answered(c, c.sample()))
                except Exception as exc:
                    self._failed(c, exc)
        if started:
            await asyncio.wait([f for _, f in started], timeout=deadline)
        for c, future in started:
            if not future.done():
                abandon(future)
                self._overran(c.name, f"did not answer within {deadline:.2f} s")
            elif (error := future.exception()) is not None:
                if not isinstance(error, Exception):
                    raise error
                self._failed(c, error)
            else:
                samples.extend(self._answered(c, future.result()))
        if self._absorb(samples):
            await self.refresh_inventory()
            self.link.republish_birth()

    def _answered(self, c: Collector, samples: list[Sample]) -> list[Sample]:
        if c.name in self._failing:
            self._failing.discard(c.name)
            log.info("collector %s recovered", c.name)
        return samples

    def _failed(self, c: Collector, exc: Exception) -> None:
        self.collector_errors += 1
        if c.name not in self._failing:
            self._failing.add(c.name)
            log.warning("collector %s failed: %r; skipping it until it recovers", c.name, exc)

    def _overran(self, name: str, why: str) -> None:
        """Count a skipped sample; say so at most once a minute per collector, with the count since."""
        count = self.overruns[name] = self.overruns.get(name, 0) + 1
        now = time.monotonic()
        last, told = self._overrun_told.get(name, (-math.inf, 0))
        if now - last >= OVERRUN_LOG_S:
            self._overrun_told[name] = (now, count)
            log.warning("collector %s: sample skipped, it %s (%d skipped since the last line)", name, why, count - told)

    def _absorb(self, samples: list[Sample]) -> bool:
        """Add a round's samples to the window; True when a collector re-read its hardware (driver loaded, MIG
        changed) and the birth must be published again."""
        self.builder.add(samples, self.clock.monotonic())
        self.samples_taken += 1
        self._restart_if_required()
        generation = sum(getattr(c, "generation", 0) for c in self.collectors)
        if generation == self._generation:
            return False
        self._generation = generation
        return True

    async def _call(self, i: int, fn: str) -> object:
        """``collector.fn()`` on its thread within ``CALL_DEADLINE_S``; raises what the call raises, TimeoutError
        or WorkerBusy."""
        c, worker = self.collectors[i], self._workers[i]
        method = getattr(c, fn)
        return method() if worker is None else await worker.call(method, CALL_DEADLINE_S)

    async def refresh_inventory(self) -> None:
        """Read every collector's inventory off the loop, all at once; one that does not answer keeps its last."""
        await asyncio.gather(*(self._inventory_of(i) for i in range(len(self.collectors))))
        merged = Inventory()
        for part in self._parts:
            merged = merged.merge(part)
        self._inventory = merged

    async def _inventory_of(self, i: int) -> None:
        c = self.collectors[i]
        try:
            part = await self._call(i, "inventory")
        except (TimeoutError, WorkerBusy) as exc:
            log.warning("collector %s did not report its inventory (%s); its last one is kept", c.name,
                        str(exc) or "timed out")  # fmt: skip
            return
        except Exception:
            log.exception("collector %s failed to report its inventory", c.name)
            return
        if isinstance(part, Inventory):
            self._parts[i] = part

    async def _workloads_of(self, i: int) -> list[WorkloadRef]:
        c = self.collectors[i]
        try:
            refs = await self._call(i, "workloads")
        except (TimeoutError, WorkerBusy) as exc:
            self._overran(c.name, f"did not attribute workloads in time ({str(exc) or 'timed out'})")
            return []
        except Exception as exc:
            log.warning("collector %s failed to attribute workloads: %r", c.name, exc)
            return []
        return refs if isinstance(refs, list) else []

    async def _workloads(self) -> list[WorkloadRef]:
        answers = await asyncio.gather(*(self._workloads_of(i) for i in range(len(self.collectors))))
        return [w for refs in answers for w in refs]

    async def close_window_async(self) -> Telemetry | None:
        """Close the open window, attributing workloads on the collectors' threads; None when it holds no sample."""
        end = self.clock.wall()
        return self.close_window([] if self.builder.samples == 0 else await self._workloads(), end)

    def _restart_if_required(self) -> None:
        """A collector that only a new process can repair (the GPU driver replaced under the loaded library) ends
        the agent with EXIT_RESTART; the open window is still published on the way out."""
        if self.exit_code:
            return
        for c in self.collectors:
            reason = getattr(c, "restart_required", None)
            if isinstance(reason, str) and reason:
                log.error("collector %s: %s; exiting (status %d) for systemd to restart the agent", c.name, reason,
                          EXIT_RESTART)  # fmt: skip
                self.exit_code = EXIT_RESTART
                self.should_exit.set()
                return

    def close_window(self, workloads: list[WorkloadRef] | None = None, end: float | None = None) -> Telemetry | None:
        """Close the open window (``workloads``: attributed already, else here); None when it holds no sample."""
        end = self.clock.wall() if end is None else end
        start, self._window_start = self._window_start, end
        if self.builder.samples == 0:
            return None
        if workloads is None:
            workloads = []
            for c in self.collectors:
                try:
                    workloads.extend(c.workloads())
                except Exception as exc:
                    log.warning("collector %s failed to attribute workloads: %r", c.name, exc)
        window = self.builder.close(self.seq, start, end, workloads, self.inventory().gpu_unavailable)
        self.seq += 1
        self.windows_closed += 1
        if self.on_window is not None:
            self.on_window(window)
        return window

    def _enqueue(self, window: Telemetry | None) -> None:
        if window is not None:
            self.queue.put(encode(window))

    async def sample_loop(self) -> None:
        """Tick on a monotonic schedule (no drift); ticks missed under load are skipped and counted."""
        interval = self.settings.sample_interval
        window = self.settings.publish_interval
        t0 = self.clock.monotonic()
        k = 0
        window_end = t0 + window
        self._window_start = self.clock.wall()
        while not self.should_exit.is_set():
            await self.sample_all()
            if k == 0:
                self.notifier.ready()
            if self._link_alive() and self._sampling_alive():
                self.notifier.watchdog(time.monotonic())
            now = self.clock.monotonic()
            if now >= window_end - interval / 2:
                try:
                    self._enqueue(await self.close_window_async())
                except Exception:  # a window lost is bad; a sampler that stops for good is worse
                    log.exception("could not close or queue a window; sampling goes on")
                if self.windows_closed == SETTLED_WINDOWS:
                    trim()
                while window_end <= now + interval / 2:
                    window_end += window
            k += 1
            due = t0 + k * interval
            if now > due + interval:
                skipped = math.floor((now - due) / interval)
                self.ticks_missed += skipped
                k += skipped
                due = t0 + k * interval
            if self.clock.monotonic() < due:
                await self.clock.sleep_until(due)
            else:  # late already: still let the broker link, the endpoint and the signal handlers run
                await asyncio.sleep(0)

    def _stuck_limit(self) -> float:
        """How long one collector call may run before the agent counts as stuck: the watchdog's period
        (``WatchdogSec``), so a device that hangs for good stops the pings and systemd restarts the agent."""
        interval = self.notifier.watchdog_interval
        return 2 * interval if interval else STUCK_S

    def _sampling_alive(self) -> bool:
        """False while a collector's call has run for longer than :meth:`_stuck_limit` (told once, and once
        more when it returns)."""
        now, limit = time.monotonic(), self._stuck_limit()
        for c, worker in zip(self.collectors, self._workers, strict=True):
            if worker is not None and (stuck := worker.stuck_for(now)) > limit:
                if self.stuck != c.name:
                    self.stuck = c.name
                    log.error(
                        "collector %s has not returned from its call for %.0f s (a device that stopped answering): "
                        "the watchdog is no longer pinged, so systemd restarts the agent",
                        c.name,
                        stuck,
                    )
                return False
        if self.stuck is not None:
            log.info("collector %s answers again", self.stuck)
            self.stuck = None
        return True

    def _link_alive(self) -> bool:
        """Whether the link task runs. One that ended (it retries every failure, so only a bug ends it) is told
        once, and the watchdog is no longer pinged: systemd restarts the agent, whose spool keeps the windows."""
        task = self._link_task
        if task is None or not task.done():
            return True
        if self.link_died is None:
            error = None if task.cancelled() else task.exception()
            self.link_died = "cancelled" if error is None else repr(error)
            log.error(
                "the broker link stopped (%s): no window is published; the watchdog restarts the agent", self.link_died
            )
        return False

    def self_metrics(self) -> list[Family]:
        link, queue = self.link, self.queue
        return [
            counter("fleetfit_agent_samples_total", "Sampling rounds over all collectors.", self.samples_taken),
            counter("fleetfit_agent_ticks_missed_total", "Sampling rounds skipped under load.", self.ticks_missed),
            counter("fleetfit_agent_windows_total", "Windows closed.", self.windows_closed),
            counter("fleetfit_agent_windows_published_total", "Windows the broker acknowledged.", link.published),
            gauge("fleetfit_agent_windows_spooled", "Windows waiting in the spool for the broker.", len(queue)),
            counter("fleetfit_agent_windows_dropped_total", "Windows dropped from a full spool.", queue.dropped),
            labelled(
                "fleetfit_agent_spool_write_errors_total",
                "counter",
                "Spool writes the disk refused, by errno (ENOSPC: disk full).",
                "reason",
                queue.write_errors,
            ),
            counter(
                "fleetfit_agent_windows_paced_total",
                "Windows held back to stay under the optimizer's per-node rate (a spool replay).",
                self.pacer.waits,
            ),
            counter(
                "fleetfit_agent_windows_resent_total",
                "Windows published again because the optimizer never received them (a full broker queue).",
                link.resent,
            ),
            counter("fleetfit_agent_collector_errors_total", "Collector failures.", self.collector_errors),
            labelled(
                "fleetfit_agent_collector_overruns_total",
                "counter",
                "Samples (and window attributions) skipped because a collector did not answer in time, by collector.",
                "collector",
                self.overruns,
            ),
            labelled(
                "fleetfit_agent_collector_busy_seconds",
                "gauge",
                "How long each collector's running call has taken so far (0 when idle); a device that hangs grows it.",
                "collector",
                {
                    c.name: w.stuck_for(time.monotonic())
                    for c, w in zip(self.collectors, self._workers, strict=True)
                    if w
                },
            ),
            counter("fleetfit_agent_counter_resets_total", "Counter resets seen.", self.builder.counter_resets),
            gauge("fleetfit_agent_broker_connected", "1 while connected to the broker.", link.connected.is_set()),
            counter("fleetfit_agent_broker_connects_total", "Broker connections made.", link.connects),
            *link.refusal_metrics(),
            gauge("fleetfit_agent_session", "This run's session number.", self.session),
        ] + [f for c in self.collectors if callable(extra := getattr(c, "metrics", None)) for f in extra()]

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Run until ``should_exit`` is set, then flush the open window and leave cleanly."""
        await self.refresh_inventory()  # off the loop: the birth is ready before the link asks for it
        link_task = self._link_task = asyncio.create_task(self.link.run(), name=f"link-{self.settings.node}")
        sampler = asyncio.create_task(self.sample_loop(), name=f"sampler-{self.settings.node}")
        if self.metrics is not None:
            try:
                await self.metrics.start()
            except OSError as exc:  # telemetry matters more than its self-metrics
                log.error("metrics endpoint on port %s unavailable (%s); running without it", self.metrics.port, exc)
                self.metrics = None
        try:
            await self.should_exit.wait()
        finally:
            self.notifier.stopping()
            sampler.cancel()
            try:
                await sampler
            except asyncio.CancelledError:
                pass
            except Exception:  # it died (and the watchdog stopped being pinged): the windows still go out
                log.exception("the sampling loop had stopped")
            self._enqueue(await self.close_window_async())
            await self._drain(self.settings.shutdown_timeout)
            await self.link.say_goodbye()
            await stop_tasks([link_task])  # (a link that died has been told of)
            self.pacer.save()
            await self._close_collectors()
            if self.metrics is not None:
                await self.metrics.stop()
            self.notifier.close()
            log.info(
                "stopped: %d window(s) closed, %d published, %d queued, %d dropped; %d tick(s) missed, "
                "%d counter reset(s), %d collector error(s)",
                self.windows_closed,
                self.link.published,
                len(self.queue),
                self.queue.dropped,
                self.ticks_missed,
                self.builder.counter_resets,
                self.collector_errors,
            )

    async def _close_collectors(self) -> None:
        """Release each collector's handles on its own thread; one whose call never returned is left as it is
        (its thread is a daemon: the process still exits)."""
        for i, c in enumerate(self.collectors):
            try:
                await self._call(i, "close")
            except (TimeoutError, WorkerBusy) as exc:
                log.warning("collector %s not closed: %s", c.name, str(exc) or "timed out")
            except Exception:
                log.exception("collector %s failed to close", c.name)

    async def _drain(self, limit: float) -> None:
        """Give the link up to ``limit`` seconds to publish what is queued, if it is connected."""
        if len(self.queue) and self.link.connected.is_set():
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: wait_for can swallow a cancellation (3.11)
                async with asyncio.timeout(limit / self.clock.scale):  # the agent's seconds (simulated ones too)
                    await self.queue.empty.wait()
        if len(self.queue):
            log.info("%d window(s) stay queued for the next start", len(self.queue))


async def serve(agent: Agent) -> None:
    """Run ``agent`` under SIGTERM/SIGINT: the first signal shuts down gracefully, a second one forces exit."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    task = asyncio.current_task()

    def on_signal(sig: signal.Signals) -> None:
        if agent.should_exit.is_set():
            log.warning("second %s: exiting now", sig.name)
            if task is not None:
                task.cancel()
            return
        log.info("%s received: publishing the open window and stopping", sig.name)
        agent.should_exit.set()

    for sig in signals:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await agent.run()
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)
