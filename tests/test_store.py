"""Storage through influxdb-client into a real VictoriaMetrics, read back through its export API."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from conftest import VictoriaMetrics, fault_size

from agent.protocol import Stats, Telemetry, TopicKind, encode, node_topic
from agent.simulate import offline_windows
from collectors.sim.scenarios import build_scenario
from optimizer.decide.catalog import load_catalog
from optimizer.ingest.fleet import Fleet
from optimizer.ingest.window import (
    Window,
    WindowDisk,
    WindowGpu,
    WindowHost,
    WindowMount,
    WindowNic,
    WindowWorkload,
    as_window,
)
from optimizer.plan.recommend import PlanSettings, build_plan
from optimizer.serve import series
from optimizer.serve import store as store_module
from optimizer.serve.store import Store, StoreSettings, plan_points, point, window_points


def _settings(url: str, **kw: object) -> StoreSettings:
    return StoreSettings(url=url, token="unused", org="fleetfit", bucket="fleetfit", flush_interval=0.2, **kw)  # type: ignore[arg-type]


async def test_windows_and_plans_round_trip_through_victoria_metrics(victoria: VictoriaMetrics) -> None:
    node = build_scenario("demo", 8, seed=1)[1]  # chat-serving on h100-002
    birth, windows = offline_windows(node, 6, site="s1")
    store = Store(_settings(victoria.url))
    for w in windows:
        store.add(window_points(birth, as_window(w)))
    fleet = Fleet("p")
    fleet.ingest(node_topic("p", "s1", node.name, TopicKind.BIRTH), encode(birth))
    for w in windows:
        fleet.ingest(node_topic("p", "s1", node.name, TopicKind.TELEMETRY), encode(w))
    plan = build_plan(fleet, "s1", load_catalog(), PlanSettings())
    store.add(plan_points(plan))
    await store.flush(10)
    assert store.written > 0 and len(store) == 0
    gpu0 = [s for s in victoria.export('{__name__="fleetfit_gpu_util"}') if s["metric"]["gpu"] == "0"]  # type: ignore[index]
    assert len(gpu0) == 1
    metric = gpu0[0]["metric"]
    assert metric["site"] == "s1" and metric["node"] == node.name  # type: ignore[index]
    assert metric["model"] == "NVIDIA H100 80GB HBM3" and metric["workload"] == node.workloads[0].id  # type: ignore[index]
    assert gpu0[0]["values"] == [w.gpus[0].util.mean for w in windows]  # type: ignore[union-attr]
    assert gpu0[0]["timestamps"] == [round(w.end * 1000) for w in windows]
    roles = {s["metric"]["nic"]: s["metric"]["role"] for s in victoria.export('{__name__="fleetfit_nic_tx_bps"}')}  # type: ignore[index]
    assert roles["ib0"] == "east_west" and roles["eth0"] == "north_south"
    (workload,) = victoria.export('{__name__="fleetfit_workload_confidence"}')
    assert workload["metric"]["class"] == "inference"  # type: ignore[index]
    plans = victoria.export('{__name__="fleetfit_plan_monthly_savings_usd"}')
    assert plans and plans[0]["metric"]["status"] == "OPTIMAL"  # type: ignore[index]
    store.close()


@pytest.mark.slow
@pytest.mark.fault
async def test_a_store_outage_loses_nothing(victoria: VictoriaMetrics) -> None:
    # seconds without the server: the short one still spans several retries (at most 2 s apart) and a buffer of
    # unsent points; the full one is `make faults`'
    outage = fault_size(10, 60)
    rounds = outage + 10
    nodes = build_scenario("mixed", 4, seed=5)
    produced = [(birth, windows) for birth, windows in (offline_windows(n, rounds, site="s1") for n in nodes)]
    store = Store(_settings(victoria.url, retry_max_delay=2.0))
    writer = asyncio.create_task(store.run())
    expected = 0
    try:
        for i in range(rounds):
            for birth, windows in produced:
                pts = window_points(birth, as_window(windows[i]))
                expected += sum(p.values for p in pts)  # one series value per field
                store.add(pts)
            if i == 5:
                victoria.stop()
                print("VictoriaMetrics stopped")
            if i == 5 + outage:
                victoria.start()
                print(f"VictoriaMetrics restarted after {outage} s")
            await asyncio.sleep(1.0)
        await store.flush(30)
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
    assert store.failures > 0 and store.dropped == 0
    names = "|".join(f"{m.name}_.*" for m in (series.GPU, series.NIC, series.DISK, series.HOST))
    stored = sum(len(s["values"]) for s in victoria.export(f'{{__name__=~"{names}"}}'))  # type: ignore[arg-type]
    print(f"points written {expected}, read back {stored}")
    assert stored == expected
    store.close()


async def test_past_the_buffer_the_oldest_points_are_dropped_and_counted() -> None:
    def down(lines: list[str]) -> None:
        raise ConnectionError("server down")

    store = Store(StoreSettings(url="http://unused", max_buffer_points=5, batch_size=2), writer=down)
    store.add(point(series.HOST, {"site": "s", "node": f"n{i}"}, {"cpu_util": i}, 1.0) for i in range(8))
    assert (len(store), store.dropped) == (5, 3)
    assert await store._write_batch() is False
    assert (len(store), store.failures) == (5, 1)
    written: list[str] = []
    store._writer = written.extend
    await store.flush(1)
    assert [line.split(",node=")[1].split(",")[0] for line in written] == ["n3", "n4", "n5", "n6", "n7"]


def test_points_only_use_declared_names() -> None:
    with pytest.raises(KeyError, match="fleetfit_host has no gpu"):
        point(series.HOST, {"site": "s", "gpu": "0"}, {}, 1.0)


def test_lines_are_what_influxdb_client_would_write() -> None:
    from influxdb_client.client.write.point import Point
    from influxdb_client.domain.write_precision import WritePrecision

    tags = {"site": "eu 1", "node": "n,1", "model": "NVIDIA H100=80GB", "workload": "odd\\", "gpu": "0"}
    fields = {"util": 1.0, "mem_util": 1e-7, "power_w": 1.5e20, "temp_c": float("nan"), "sm_clock_mhz": None}
    line = point(series.GPU, tags, fields, 1_700_000_000.25)
    reference = Point(series.GPU.name).time(1_700_000_000_250_000_000, WritePrecision.NS)
    for k, v in tags.items():
        reference.tag(k, v)
    for k, f in fields.items():
        if f is not None:
            reference.field(k, f)
    assert line.text == reference.to_line_protocol()  # type: ignore[no-untyped-call]
    assert line.values == 3  # NaN and None are not written
    assert point(series.HOST, {"site": "s"}, {"cpu_util": None}, 1.0).values == 0  # no line without a value


async def test_the_writer_task_stops_when_cancelled_as_a_batch_becomes_ready() -> None:
    """A shutdown that lands in the same loop step as a full batch must still end the writer task."""
    written: list[str] = []
    store = Store(StoreSettings(url="http://unused", batch_size=1, flush_interval=30.0), writer=written.extend)
    task = asyncio.create_task(store.run())
    await asyncio.sleep(0.01)  # the task now waits for a batch
    store.add([point(series.HOST, {"site": "s", "node": "n1"}, {"cpu_util": 1.0}, 1.0)])
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(asyncio.shield(task), timeout=2.0)


def _unchecked(w: Telemetry) -> Window:
    """``w`` as a Window, values as they are: a reader would refuse the tag that shows the escaping."""
    d = w.model_dump()
    return Window(
        **d
        | {
            "gpus": [WindowGpu(**g) for g in d["gpus"]],
            "nics": [WindowNic(**n) for n in d["nics"]],
            "disks": [WindowDisk(**x) for x in d["disks"]],
            "host": WindowHost(**d["host"]),
            "mounts": [WindowMount(**m) for m in d["mounts"]],
            "workloads": [WindowWorkload(**r) for r in d["workloads"]],
        }
    )


def test_window_lines_are_what_influxdb_client_would_write() -> None:
    """Each window's lines, built by hand for speed, against influxdb-client's Point for the same values:
    every GPU, NIC, disk and host field, tags sorted and escaped, GPUs without a model or workload."""
    from influxdb_client.client.write.point import Point
    from influxdb_client.domain.write_precision import WritePrecision

    node = build_scenario("mixed", 6, seed=2)[5]
    birth, windows = offline_windows(node, 2, site="eu-1")
    odd = windows[0].model_copy(update={"node": "n,1 x"})  # a tag needing escapes (never sent: shows the escaping)
    # 10-sample windows have p95 = max: one GPU where they differ
    spread = windows[1].gpus[0].model_copy(update={"util": Stats(10.0, 20.0, 30.0, 1.0)})
    windows[1] = windows[1].model_copy(update={"gpus": [spread, *windows[1].gpus[1:]]})
    # sections with figures absent, a number never written before, a GPU with none but xid_events; every value
    # a window holds is finite (the reader refuses NaN and infinities)
    sparse = windows[1].gpus[1].model_copy(update={"power_w": None, "temp_c": None, "xid_events": 3})
    new = windows[1].gpus[2].model_copy(update={"sm_clock_mhz": Stats(1234.5678, 1300.0, 1400.0, 0.0)})
    arrays = [f for f, v in windows[1].gpus[3] if isinstance(v, Stats)]
    bare_gpu = windows[1].gpus[3].model_copy(update=dict.fromkeys(arrays))
    nics = [n.model_copy(update={"rx_bps": None, "errors": 2}) for n in windows[1].nics[:1]] + windows[1].nics[1:]
    host = windows[1].host.model_copy(update={"cpu_util": None, "mem_used_pct": Stats(40.0, 45.0, 50.0, 1.0)})
    gaps = windows[1].model_copy(
        update={"gpus": [sparse, new, bare_gpu, *windows[1].gpus[4:]], "nics": nics, "host": host, "seq": 9}
    )
    # the same node again with another model in a new birth, and with another workload on a GPU: tags cached per
    # node must follow both
    renamed = birth.model_copy(
        update={"gpus": [birth.gpus[0].model_copy(update={"model": "NVIDIA X"}), *birth.gpus[1:]]}
    )
    moved = windows[1].model_copy(
        update={"gpus": [windows[1].gpus[0].model_copy(update={"workload": "k8s/other"}), *windows[1].gpus[1:]]}
    )
    cases = [
        (birth, windows[1]),
        (None, windows[0]),
        (birth, odd),
        (birth, gaps),
        (renamed, windows[1]),
        (birth, moved),
    ]
    for b, w in cases + cases:  # again: the numbers' texts and the lines' tags are now cached
        models = {g.index: g.model for g in b.gpus} if b else {}
        expected = []
        for g in w.gpus:
            stats = {f: getattr(g, f) for f in series.GPU.fields if f in type(g).model_fields}
            fields = {f: s.mean for f, s in stats.items() if s is not None and f != "xid_events"}
            fields |= {"xid_events": g.xid_events} | (
                {"util_p95": g.util.p95, "util_max": g.util.max} if g.util else {}
            )
            tags = {
                "site": w.site,
                "node": w.node,
                "gpu": str(g.index),
                "model": models.get(g.index),
                "workload": g.workload,
            }
            expected.append((series.GPU, tags, fields))
        roles = {n.name: n.role.value for n in b.nics} if b else {}
        for n in w.nics:
            fields = {"errors": n.errors, "drops": n.drops}
            for f in ("rx_bps", "tx_bps"):
                if (s := getattr(n, f)) is not None:
                    fields |= {f: s.mean, f"{f}_max": s.max}
            expected.append(
                (
                    series.NIC,
                    {"site": w.site, "node": w.node, "nic": n.name, "role": roles.get(n.name, "other")},
                    fields,
                )
            )
        for d in w.disks:
            fields = {f: s.mean for f in ("read_bps", "write_bps", "read_iops", "write_iops") if (s := getattr(d, f))}
            fields |= {"write_bps_max": d.write_bps.max} if d.write_bps else {}
            expected.append((series.DISK, {"site": w.site, "node": w.node, "disk": d.name}, fields))
        host = {f: s.mean for f in ("cpu_util", "mem_used_pct") if (s := getattr(w.host, f))}
        expected.append((series.HOST, {"site": w.site, "node": w.node}, host))
        lines = []
        for m, tags, fields in expected:
            p = Point(m.name).time(round(w.end * 1e6) * 1000, WritePrecision.NS)
            for k, v in tags.items():
                if v:
                    p.tag(k, v)
            for k, f in fields.items():
                p.field(k, float(f))
            lines.append(p.to_line_protocol())  # type: ignore[no-untyped-call]
        written = window_points(b, _unchecked(w))
        assert [line.text for line in written] == lines
        assert all(line.values == line.text.rsplit(" ", 2)[1].count("=") for line in written)


def test_a_node_that_renames_its_workloads_or_figures_every_window_holds_bounded_state() -> None:
    """A node may report a new workload name, or another set of absent figures, in every window: its lines stay
    right, and what the store keeps to write them stays one set of tags for the node and a bounded set of
    layouts."""
    node = build_scenario("mixed", 6, seed=2)[5]
    birth, windows = offline_windows(node, 2, site="hostile-1")
    window = windows[0]
    arrays = [f for f, v in window.gpus[0] if isinstance(v, Stats)]
    assert len(window.gpus) == 8 and all(getattr(g, arrays[0]) is not None for g in window.gpus)
    heads = len(store_module._HEADS)
    for i in range(300):
        # GPU k without its first figure where bit k of i is set, GPU 0 without its second too past 255: 300
        # different sets of absent figures
        gpus = [
            g.model_copy(
                update=({"workload": f"k8s/x-{i}"} if g.index == 0 else {})
                | ({arrays[0]: None} if i >> g.index & 1 else {})
                | ({arrays[1]: None} if g.index == 0 and i >= 256 else {})
            )
            for g in window.gpus
        ]
        lines = window_points(birth, as_window(window.model_copy(update={"gpus": gpus})))
        assert f",workload=k8s/x-{i} " in lines[0].text
    assert len(store_module._HEADS) <= heads + 1
    layouts = len(store_module._GPU_FIELDS.layouts)
    assert layouts <= store_module.LAYOUTS_CACHED and layouts < 300, "not every set of absent figures is kept"
