"""`fleetfit demo` serves the console on a free local port and prints its URL; a newcomer who opens it sees
the planted problems and their actions, and can decide on them with the printed token."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

from conftest import FLEETFIT

PLANTED = {"chat-serving", "vision-finetune-ddp", "forgotten-notebook-alloc"}
# The day of history the demo replays shows chat-serving's daily peak, which the L40S cards would not carry.
ACTED_ON = PLANTED - {"chat-serving"}


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


def test_demo_prints_the_console_url_and_keeps_serving_until_ctrl_c() -> None:
    proc = subprocess.Popen(
        [FLEETFIT, "demo", "--nodes", "8", "--duration", "12", "--time-scale", "20", "--keep-serving"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        found = re.match(r"console: (http://127\.0\.0\.1:\d+/)  \(token for its buttons: (\S+)\)", first)
        assert found, first
        base, token = found.group(1), found.group(2)
        deadline = time.monotonic() + 60
        recs: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            recs = json.loads(_get(f"{base}api/v1/recommendations"))
            # a plan taken while the fleet's day of history was still arriving may move the idle allocation
            if {r["workload_name"] for r in recs} == ACTED_ON and {r["kind"] for r in recs} == {"move", "reclaim"}:
                break
            time.sleep(1)
        assert {r["workload_name"] for r in recs} == ACTED_ON
        assert {r["kind"] for r in recs} == {"move", "reclaim"}
        overview = _get(base)
        assert all(name in overview for name in PLANTED) and "/month" in overview
        page = _get(f"{base}recommendations")
        assert page.count('data-action="ack"') == 2
        # the printed token decides, as the buttons do
        request = urllib.request.Request(
            f"{base}api/v1/recommendations/{recs[0]['id']}/ack",
            method="POST",
            headers={"Authorization": f"Bearer {token}"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.loads(response.read())["state"] == "acknowledged"
        time.sleep(14)  # past the run: the console is still up
        assert proc.poll() is None
        assert "acknowledged" in _get(f"{base}recommendations?state=all")
    finally:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-2000:]
    assert "final plan:" in stdout and "Traceback" not in stderr
    try:
        _get(base)
        raise AssertionError("the console outlived the demo")
    except (urllib.error.URLError, ConnectionError):
        pass
