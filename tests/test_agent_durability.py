"""The spool, RDMA counters and systemd notify: the parts of the agent that keep data and keep systemd informed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from pathlib import Path

import pytest
from conftest import MosquittoServer, durable_subscriber, private_broker, start_agent, wait_until, write_agent_config

from agent.notify import Notifier
from agent.spool import DiskSpool, MemoryQueue
from collectors.nic import NicCollector


def test_disk_spool_keeps_order_across_reopen_and_drops_the_oldest_at_the_cap(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_windows=3, max_bytes=10_000)
    for i in range(5):
        spool.put(f'{{"seq": {i}}}'.encode())
    assert spool.dropped == 2 and len(spool) == 3
    token, payload = spool.peek() or (0, b"")
    assert json.loads(payload)["seq"] == 2
    spool.pop(token)
    (tmp_path / "9999999999999999.tmp").write_bytes(b"half a window")  # a write cut short by a crash
    reopened = DiskSpool(tmp_path, max_windows=3, max_bytes=10_000)
    seqs = []
    while (head := reopened.peek()) is not None:
        seqs.append(json.loads(head[1])["seq"])
        reopened.pop(head[0])
    assert seqs == [3, 4]
    assert reopened.empty.is_set()
    assert not list(tmp_path.glob("*.tmp"))
    reopened.put(b'{"seq": 5}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0000000000000005.window"]  # numbering continues


def test_disk_spool_byte_cap(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path, max_windows=100, max_bytes=250)
    for _ in range(5):
        spool.put(b"x" * 100)
    assert len(spool) == 2 and spool.dropped == 3


def test_disk_spool_holds_exactly_its_byte_cap_and_drops_at_one_byte_past(tmp_path: Path) -> None:
    """``max_bytes`` is what the spool may hold: three 100-byte windows fill 300 bytes with none dropped; a third
    window of 101 bytes is one byte past, and only the oldest window goes. Catches the cap checked with ``>=``
    (a spool that drops a window as soon as it is exactly full)."""
    full = DiskSpool(tmp_path / "full", max_windows=100, max_bytes=300)
    for i in range(3):
        full.put(b"%d" % i + b"x" * 99)
    assert len(full) == 3 and full.dropped == 0
    assert sum(p.stat().st_size for p in (tmp_path / "full").iterdir()) == 300
    past = DiskSpool(tmp_path / "past", max_windows=100, max_bytes=300)
    for payload in (b"a" * 100, b"b" * 100, b"c" * 101):
        past.put(payload)
    assert len(past) == 2 and past.dropped == 1
    assert (past.peek() or (0, b""))[1] == b"b" * 100  # the oldest was dropped, not the window just put


def test_pop_after_the_head_was_dropped_keeps_the_next_window() -> None:
    queue = MemoryQueue(2)
    queue.put(b"a")
    token, _ = queue.peek() or (0, b"")
    queue.put(b"b")
    queue.put(b"c")  # drops "a" while it is being published
    queue.pop(token)
    assert [queue.peek()] == [(1, b"b")]


def test_memory_queue_byte_cap_drops_the_oldest_and_counts_them() -> None:
    """As the disk spool's byte cap: 100-byte windows under 250 bytes keep the newest two and count three drops.
    Deliberate bug caught: the queue bounded in windows alone (its 1,000 here), holding all five."""
    queue = MemoryQueue(1000, max_bytes=250)
    for i in range(5):
        queue.put(bytes([48 + i]) * 100)
    assert len(queue) == 2 and queue.dropped == 3
    assert (queue.peek() or (0, b""))[1][:1] == b"3"  # the oldest went first


def _window(seq: int, size: int) -> bytes:
    head = f'{{"node":"n","site":"s","session":1,"seq":{seq},"pad":"'.encode()
    return head + b"x" * (size - len(head) - 2) + b'"}'


def test_memory_queue_holds_no_more_than_its_bytes_with_sent_windows_kept() -> None:
    """An agent on the memory queue (its spool directory unusable) with a broker away: 256 KiB windows, the
    largest a payload may be, under a 1 MiB bound hold at most 1 MiB, sent windows included, and the sent ones
    give way before a queued one is dropped. Deliberate bug caught: sent windows kept by count alone (360 of
    them: 90 MiB), or trimmed after queued windows are dropped."""
    window = 256 * 1024
    queue = MemoryQueue(8640, keep_sent=360, max_bytes=1 << 20)
    for seq in range(3):  # three sent: 768 KiB kept for a resend
        queue.put(_window(seq, window))
        token, _ = queue.peek() or (0, b"")
        queue.pop(token)
    assert queue.held_bytes == 3 * window
    for seq in range(3, 7):  # four queued: 1 MiB, so every sent one gives way and none queued is dropped
        queue.put(_window(seq, window))
    assert len(queue) == 4 and queue.dropped == 0 and queue.held_bytes == 4 * window
    assert queue.resend([(1, 0, 2)]) == 0  # the sent ones are gone
    for seq in range(7, 200):
        queue.put(_window(seq, window))
        assert queue.held_bytes <= 1 << 20
    assert len(queue) == 4 and queue.dropped == 193


def _rdma_tree(root: Path) -> None:
    ib = root / "class" / "infiniband"
    for dev, layer, rate, words in (
        ("mlx5_0", "InfiniBand", "400 Gb/sec (4X NDR)", 1000),
        ("mlx5_1", "Ethernet", "200 Gb/sec (4X HDR)", 50),
    ):
        port = ib / dev / "ports" / "1"
        (port / "counters").mkdir(parents=True)
        (port / "hw_counters").mkdir()
        (port / "link_layer").write_text(f"{layer}\n")
        (port / "rate").write_text(f"{rate}\n")
        (port / "counters" / "port_xmit_data").write_text(f"{words}\n")
        (port / "counters" / "port_rcv_data").write_text(f"{words * 2}\n")
        (port / "counters" / "symbol_error").write_text("3\n")
        (port / "counters" / "port_xmit_discards").write_text("1\n")
        (port / "hw_counters" / "out_of_sequence").write_text("4\n")
    (ib / "mlx5_0" / "device" / "net" / "ib0").mkdir(parents=True)
    (ib / "mlx5_1" / "ports" / "1" / "gid_attrs" / "ndevs").mkdir(parents=True)
    (ib / "mlx5_1" / "ports" / "1" / "gid_attrs" / "ndevs" / "0").write_text("ens1f1\n")


def test_rdma_traffic_comes_from_the_port_counters(tmp_path: Path) -> None:
    _rdma_tree(tmp_path)
    nic = NicCollector(sysfs_root=tmp_path)
    by_name = {n.name: n for n in nic.inventory().nics}
    assert by_name["ib0"].kind == "infiniband" and by_name["ib0"].role == "east_west"
    assert by_name["ib0"].speed_mbps == 400_000
    assert by_name["ens1f1"].kind == "roce" and by_name["ens1f1"].role == "east_west"
    samples = {s.key: s for s in nic.sample()}
    assert samples["ib0"].counters["tx_bps"] == 4000  # 4-byte words
    assert samples["ib0"].counters["rx_bps"] == 8000
    assert samples["ib0"].counters["errors"] == 7 and samples["ib0"].counters["drops"] == 1


def test_notifier_speaks_to_an_abstract_socket() -> None:
    name = f"fleetfit-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind("\0" + name)
    server.settimeout(2)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "4000000"})
        assert notifier.watchdog_interval == 2.0
        notifier.ready()
        notifier.watchdog(100.0)
        notifier.watchdog(101.0)  # too soon: no second ping
        notifier.watchdog(102.0)
        assert [server.recv(64) for _ in range(3)] == [b"READY=1", b"WATCHDOG=1", b"WATCHDOG=1"]
    finally:
        server.close()
    assert not Notifier({}).send("READY=1")


async def test_sd_notify_ready_watchdog_stopping(mosquitto: MosquittoServer, prefix: str, tmp_path: Path) -> None:
    path = tmp_path / "notify.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(path))
    server.setblocking(False)
    env = {**os.environ, "NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "2000000"}
    proc = await start_agent(write_agent_config(tmp_path, mosquitto.port, prefix, "dur-node"), env=env)
    loop = asyncio.get_running_loop()
    messages: list[bytes] = []
    try:
        while messages.count(b"WATCHDOG=1") < 3:
            messages.append(await asyncio.wait_for(loop.sock_recv(server, 64), 10))
        proc.send_signal(signal.SIGTERM)
        while b"STOPPING=1" not in messages:
            messages.append(await asyncio.wait_for(loop.sock_recv(server, 64), 10))
        assert await asyncio.wait_for(proc.wait(), 20) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
        server.close()
    assert messages[0] == b"READY=1"
    assert messages.count(b"READY=1") == 1


@pytest.mark.slow
@pytest.mark.fault
async def test_outage_then_kill_9_then_restart_loses_no_completed_window(tmp_path: Path, prefix: str) -> None:
    broker = private_broker(tmp_path)
    port = broker.port
    config = write_agent_config(tmp_path, port, prefix, "dur-node")
    spool = tmp_path / "state" / "spool"
    # the broker is down: windows pile up in the spool
    first = await start_agent(config)
    # three windows spooled, however long the agent took to start on a busy machine
    await wait_until(lambda: len(list(spool.glob("*.window"))) >= 3, 30, "three spooled windows")
    await asyncio.sleep(0.5)  # and some way into the next
    first.kill()  # kill -9 in the middle of the outage
    await first.wait()
    spooled = sorted(spool.glob("*.window"))
    assert len(spooled) >= 3
    session = int((tmp_path / "state" / "session").read_text())
    expected = [json.loads(p.read_bytes())["seq"] for p in spooled]
    broker.start()
    payloads: list[bytes] = []
    collector = asyncio.create_task(durable_subscriber(port, f"{prefix}/lab/dur-node/telemetry", payloads))
    await asyncio.sleep(0.5)
    second = await start_agent(config)
    try:
        await wait_until(lambda: any(json.loads(p)["session"] > session for p in payloads), 30, "the new session")
        received = [json.loads(p) for p in payloads]
        old = [r for r in received if r["session"] == session]
        print(f"windows spooled before SIGKILL {len(expected)}, replayed after restart {len(old)}")
        assert [r["seq"] for r in old] == expected == list(range(len(expected)))
        starts = [r["start"] for r in old]
        assert starts == sorted(starts)  # original timestamps, in order
        assert received[: len(old)] == old  # replayed before the new session's windows
        assert not list(spool.glob("*.window")) or len(list(spool.glob("*.window"))) <= 1
    finally:
        second.send_signal(signal.SIGTERM)
        await asyncio.wait_for(second.wait(), 20)
        collector.cancel()
        broker.stop()


def test_an_unusable_spool_directory_keeps_spool_max_mb_in_memory(tmp_path: Path) -> None:
    """The memory queue an agent falls back to when its spool directory cannot be used holds ``spool_max_mb``,
    not its own default (bug: open_spool built the MemoryQueue without max_bytes: 256 MiB whatever was set)."""
    from agent.config import AgentSettings
    from agent.service import open_spool
    from agent.spool import MemoryQueue

    blocker = tmp_path / "state"
    blocker.write_text("a file where the state directory should be")
    queue = open_spool(AgentSettings(state_dir=blocker, spool_max_mb=1))
    assert isinstance(queue, MemoryQueue) and queue.max_bytes == 2**20
