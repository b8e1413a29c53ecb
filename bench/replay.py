"""A fleet's windows simulated ahead of a run, then published on the live schedule from one thread.

The simulator computes every node's 1 Hz samples as it goes: ~4.5 ms of CPU per 10 s window, so at 2,000 nodes it
needs most of a core and, beside the optimizer on a 2-core machine, falls behind. Replaying windows it made before
the clock starts leaves the measured minutes to the optimizer, the broker and the store.

Each node's first ``per_node`` windows are simulated (the same engine and window code as ``fleetfit simulate``,
seed per node); the run cycles through them with fresh sequence numbers and times, so a node repeats its own
``per_node * 10`` seconds of behaviour. Nodes start spread over one window, as agents do. Window bytes are made
once with sentinel numbers; publishing swaps in the sequence number and times, so a window costs a few µs to send.
Prepared windows are kept in this user's cache directory for the next run of the same fleet and code.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from agent.protocol import TopicKind, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.scenarios import ScenarioNode, build_scenario

PREFIX = "fleetfit/v1"
WINDOW_S = 10.0
# Numbers no window holds, replaced in the encoded bytes at publish time.
_SEQ = 987_654_321
_START = 1_111_111_111.125
_END = 1_111_111_121.125


_SCENARIOS: dict[tuple[str, int], list[ScenarioNode]] = {}  # per worker process: built once, not per node


def _node(job: tuple[str, int, str, int, int]) -> tuple[str, bytes, list[bytes]]:
    scenario, count, site, index, per_node = job
    fleet = _SCENARIOS.get((scenario, count))
    if fleet is None:
        fleet = _SCENARIOS[(scenario, count)] = build_scenario(scenario, count, seed=0)
    node = fleet[index]
    birth, windows = offline_windows(node, per_node, WINDOW_S, site=site, seed=index)
    templates = []
    for w in windows:
        data = encode(w.model_copy(update={"seq": _SEQ, "start": _START, "end": _END}))
        for sentinel in (_SEQ, _START, _END):
            if data.count(str(sentinel).encode()) != 1:
                raise RuntimeError(f"sentinel {sentinel} not unique in a window of {node.name}")
        templates.append(data)
    return node.name, encode(birth.model_copy(update={"timestamp": time.time()})), templates


def _cache_dir() -> Path:
    """This user's own cache directory, never a shared one: a pickle planted where another user can write would
    run its code when loaded."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = base / "fleetfit-bench"
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = directory.stat()
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise RuntimeError(f"{directory} is not this user's alone: not reading cached windows from it")
    return directory


def _code() -> str:
    """A digest of the code that makes the windows: the simulator, the agent's window code and the protocol."""
    root = Path(__file__).resolve().parent.parent
    files = sorted([*(root / "collectors" / "sim").glob("*.py"), *(root / "agent").glob("*.py")])
    return hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:12]


class Replay:
    """``nodes`` nodes of ``scenario`` at ``site``, prepared on ``processes`` processes, published from a thread."""

    def __init__(self, scenario: str, nodes: int, site: str, per_node: int = 6, processes: int = 2) -> None:
        cache = _cache_dir() / f"replay-{scenario}-{nodes}-{site}-{per_node}-{_code()}.pickle"
        if cache.exists():  # the same fleet by the same code as a run before
            self.nodes = pickle.loads(cache.read_bytes())
        else:
            jobs = [(scenario, nodes, site, i, per_node) for i in range(nodes)]
            with ProcessPoolExecutor(processes) as pool:
                self.nodes = list(pool.map(_node, jobs, chunksize=max(1, nodes // (processes * 8))))
            cache.write_bytes(pickle.dumps(self.nodes))
        self.site = site
        self.published = 0
        self.late: list[float] = []  # how late each window left against its schedule
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, port: int, duration: float) -> None:
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-replay-{self.site}")
        client.max_queued_messages_set(0)
        client.max_inflight_messages_set(1000)
        client.connect("127.0.0.1", port)
        client.loop_start()
        for name, birth, _ in self.nodes:
            client.publish(node_topic(PREFIX, self.site, name, TopicKind.BIRTH), birth, qos=1, retain=True)
        self._thread = threading.Thread(target=self._run, args=(client, duration), daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, client: paho.Client, duration: float) -> None:
        n = len(self.nodes)
        topics = [node_topic(PREFIX, self.site, name, TopicKind.TELEMETRY) for name, _, _ in self.nodes]
        began = time.time()
        k = 0
        while not self._stop.is_set():
            for i, (_, _, templates) in enumerate(self.nodes):
                end = began + WINDOW_S * (k + 1) + WINDOW_S * i / n  # spread over one window, as agents start
                if end - began > duration:
                    self._finish(client)
                    return
                wait = end - time.time()
                if wait > 0 and self._stop.wait(wait):
                    break
                self.late.append(max(0.0, time.time() - end))
                payload = (
                    templates[k % len(templates)]
                    .replace(b"987654321", str(k).encode())
                    .replace(b"1111111111.125", repr(end - WINDOW_S).encode())
                    .replace(b"1111111121.125", repr(end).encode())
                )
                client.publish(topics[i], payload, qos=1)
                self.published += 1
            k += 1
        self._finish(client)

    @staticmethod
    def _finish(client: paho.Client) -> None:
        time.sleep(1.0)  # what is in flight is acknowledged
        client.loop_stop()
        client.disconnect()
