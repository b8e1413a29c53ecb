"""A full or failing disk under the spool: windows are never truncated, sampling goes on, writes recover.

The real failures come from a small tmpfs (needs root for ``mount``; skipped otherwise); a short ``os.write``
is also produced by a wrapper that writes fewer bytes than asked, as the kernel may at any time.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FLEETFIT, free_port

from agent import spool as spool_module
from agent.session import next_session
from agent.spool import DiskSpool

PAGE = 4096


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: ENOSPC and short writes from the real kernel."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(directory: Path, leave: int = 0) -> Path:
    """Take every free byte of ``directory``'s file system but ``leave``."""
    filler = directory / "filler"
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    with filler.open("wb") as f, contextlib.suppress(OSError):
        f.write(b"\0" * max(0, free - leave))
    return filler


def _windows(spool_dir: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(spool_dir.glob("*.window"))]


def test_a_short_write_is_completed_not_renamed_truncated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = os.write
    calls = []

    def stingy_write(fd: int, data: bytes | memoryview) -> int:
        calls.append(len(data))
        return real_write(fd, bytes(data[:100]))  # what a signal or a nearly full disk makes write() do

    monkeypatch.setattr(spool_module.os, "write", stingy_write)
    spool = DiskSpool(tmp_path, max_windows=10, max_bytes=1 << 20)
    payload = json.dumps({"seq": 1, "pad": "x" * 1000}).encode()
    spool.put(payload)
    assert len(calls) > 1
    assert _windows(tmp_path) == [payload]


def test_the_real_kernel_short_write_never_leaves_a_truncated_window(small_disk: Path) -> None:
    spool = DiskSpool(small_disk / "spool", max_windows=100, max_bytes=1 << 20)
    old = json.dumps({"seq": 0, "pad": "o" * 6000}).encode()  # two pages
    spool.put(old)
    _fill(small_disk, leave=2 * PAGE)
    new = json.dumps({"seq": 1, "pad": "n" * 20_000}).encode()  # five pages: the kernel takes two, then ENOSPC
    spool.put(new)
    for payload in _windows(small_disk / "spool"):
        json.loads(payload)  # every spooled window is whole
    assert spool.write_errors.get("ENOSPC", 0) >= 1
    assert not list((small_disk / "spool").glob("*.tmp"))


def test_a_full_disk_drops_the_oldest_window_then_recovers(small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    spool = DiskSpool(small_disk / "spool", max_windows=100, max_bytes=1 << 20)
    for seq in range(3):
        spool.put(json.dumps({"seq": seq}).encode())
    filler = _fill(small_disk)
    for seq in range(3, 8):
        spool.put(json.dumps({"seq": seq}).encode())  # never raises
    assert spool.write_errors["ENOSPC"] >= 5
    assert [json.loads(p)["seq"] for p in _windows(small_disk / "spool")] == [5, 6, 7]  # the newest kept
    assert spool.dropped == 5
    errors = [r for r in caplog.records if "cannot write to the spool" in r.getMessage()]
    assert len(errors) == 1  # one line per episode, not one per window
    filler.unlink()
    for seq in range(8, 12):
        spool.put(json.dumps({"seq": seq}).encode())
    assert [json.loads(p)["seq"] for p in _windows(small_disk / "spool")] == [5, 6, 7, 8, 9, 10, 11]
    assert any("spool writable again" in r.getMessage() for r in caplog.records)


def test_an_io_error_drops_only_the_new_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = DiskSpool(tmp_path, max_windows=10, max_bytes=1 << 20)
    spool.put(b'{"seq": 0}')

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(spool_module.os, "fsync", failing_fsync)
    spool.put(b'{"seq": 1}')
    assert spool.write_errors == {"EIO": 1} and spool.dropped == 1
    assert _windows(tmp_path) == [b'{"seq": 0}']  # still there to publish
    monkeypatch.undo()
    spool.put(b'{"seq": 2}')
    assert _windows(tmp_path) == [b'{"seq": 0}', b'{"seq": 2}']


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _wait(predicate: object, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.fault
def test_the_agent_keeps_sampling_on_a_full_disk_and_recovers(small_disk: Path, tmp_path: Path) -> None:
    metrics_port = free_port()
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nnode = "full-node"\nsite = "lab"\npublish_interval = 1.0\nstate_dir = "{small_disk}"\n'
        f"metrics_port = {metrics_port}\n"
        f'[mqtt]\nhost = "127.0.0.1"\nport = {free_port()}\nreconnect_max_delay = 1.0\n'  # no broker: windows spool
    )
    log = tmp_path / "agent.log"
    with log.open("wb") as stderr:
        agent = subprocess.Popen([FLEETFIT, "agent", "--config", str(config), "--simulate", "l4x2"], stderr=stderr)
    spool_dir = small_disk / "spool"
    try:
        _wait(lambda: len(_windows(spool_dir)) >= 2, 20, "windows in the spool")
        filler = _fill(small_disk)
        _wait(
            lambda: _metric(metrics_port, 'fleetfit_agent_spool_write_errors_total{reason="ENOSPC"}') >= 2, 20, "ENOSPC"
        )
        samples = _metric(metrics_port, "fleetfit_agent_samples_total")
        time.sleep(2.5)
        assert _metric(metrics_port, "fleetfit_agent_samples_total") >= samples + 2  # sampling goes on
        assert _metric(metrics_port, "fleetfit_agent_windows_dropped_total") >= 1
        for payload in _windows(spool_dir):
            json.loads(payload)
        full = len(_windows(spool_dir))
        filler.unlink()
        _wait(lambda: len(_windows(spool_dir)) >= full + 2, 20, "the spool growing again once space is freed")
    finally:
        agent.terminate()
        agent.wait(20)
    text = log.read_text()
    assert "Traceback" not in text
    assert text.count("cannot write to the spool") == 1
    assert "spool writable again" in text


def test_a_restored_state_directory_never_reuses_a_session(tmp_path: Path) -> None:
    backup = tmp_path / "backup"
    backup.mkdir()
    clock = [1_800_000_000.0]
    first = next_session(tmp_path / "state", lambda: clock[0])
    (backup / "session").write_bytes((tmp_path / "state" / "session").read_bytes())
    clock[0] += 60
    second = next_session(tmp_path / "state", lambda: clock[0])
    (tmp_path / "state" / "session").write_bytes((backup / "session").read_bytes())  # restored from the backup
    clock[0] += 60
    third = next_session(tmp_path / "state", lambda: clock[0])
    assert first < second < third
    # several starts within one second still count up
    assert next_session(tmp_path / "state", lambda: clock[0]) == third + 1


def test_a_state_directory_that_cannot_hold_the_spool_leaves_the_agent_a_queue_in_memory(tmp_path: Path) -> None:
    from agent.config import AgentConfig, AgentSettings
    from agent.service import Agent
    from agent.spool import MemoryQueue

    (tmp_path / "not-a-directory").write_text("")
    settings = AgentSettings(node="n1", site="s1", state_dir=tmp_path / "not-a-directory" / "state")
    agent = Agent(AgentConfig(agent=settings), [], session=1)
    assert isinstance(agent.queue, MemoryQueue)
    agent.queue.put(b"{}")
    assert len(agent.queue) == 1
