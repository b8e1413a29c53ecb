"""The shipped systemd units: `systemd-analyze verify` passes, and their sandboxes score the exposure
docs/operations.md promises under `systemd-analyze security --offline=yes`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import FLEETFIT

UNITS = Path(__file__).resolve().parent.parent / "systemd"
DOCS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
MAX_EXPOSURE = {"fleetfit-agent.service": 2.0, "fleetfit-optimizer.service": 2.5}
DROP_IN = UNITS / "fleetfit-agent.service.d" / "attribution.conf.example"


def _installed(tmp_path: Path, name: str) -> Path:
    """The unit as installed, with ExecStart pointing at this checkout's command (verify checks it exists)."""
    if not shutil.which("systemd-analyze"):
        pytest.fail("systemd-analyze is not installed: `make test` installs it (apt-get install systemd)")
    unit = tmp_path / name
    unit.write_text((UNITS / name).read_text().replace("/opt/fleetfit/bin/fleetfit", FLEETFIT))
    return unit


@pytest.mark.parametrize("name", sorted(MAX_EXPOSURE))
def test_unit_verifies_and_its_exposure_is_as_documented(tmp_path: Path, name: str) -> None:
    unit = _installed(tmp_path, name)
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert verify.returncode == 0 and name not in verify.stderr, verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = re.search(rf"Overall exposure level for {re.escape(name)}: ([0-9.]+)", security.stdout)
    assert found, security.stdout[-2000:] + security.stderr
    exposure = float(found.group(1))
    assert exposure <= MAX_EXPOSURE[name]
    assert f"`{name}` | {exposure}" in DOCS.read_text()  # the figure in the docs is today's


def test_units_keep_the_essentials() -> None:
    agent = (UNITS / "fleetfit-agent.service").read_text()
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "Restart=on-failure",
        "StateDirectory=fleetfit-agent",
        "DevicePolicy=closed",
        "DeviceAllow=/dev/nvidiactl rw",
        "DeviceAllow=/dev/nvidia-uvm rw",
        "DeviceAllow=char-nvidia* rw",
        "DeviceAllow=char-kfd rw",  # AMD: /dev/kfd
        "DeviceAllow=char-drm rw",  # AMD: /dev/dri/card*, /dev/dri/renderD*
        "DeviceAllow=char-accel rw",  # Gaudi: /dev/accel/accel*
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "LoadCredential=mqtt-password:",
    ):
        assert line in agent, line
    # NVLink links come up when the fabric manager has trained them; the agent starts after it where it exists
    (after,) = [line for line in agent.splitlines() if line.startswith("After=")]
    assert "nvidia-fabricmanager.service" in after.split("=", 1)[1].split()
    # The agent exits to reload a replaced GPU driver's library: restarted, but never in a fast loop
    limits = dict(line.split("=", 1) for line in agent.splitlines() if line.startswith(("StartLimit", "RestartSec")))
    assert int(limits["StartLimitBurst"]) * int(limits["RestartSec"]) < int(limits["StartLimitIntervalSec"])
    optimizer = (UNITS / "fleetfit-optimizer.service").read_text()
    for line in ("DynamicUser=yes", "StateDirectory=fleetfit-optimizer", "PrivateDevices=yes", "Restart=on-failure"):
        assert line in optimizer, line


def _directives(text: str, name: str) -> list[str]:
    return [v for line in text.splitlines() if line.startswith(f"{name}=") for v in line.split("=", 1)[1].split()]


def test_the_agent_unit_lets_every_supported_vendors_devices_through() -> None:
    """AMD's /dev/kfd and /dev/dri/renderD* are group render (card* group video): the unit's dynamic user gets
    both groups, and the device policy lets NVIDIA's, AMD's and Gaudi's device classes through, nothing with
    capabilities.

    Deliberate bug it catches: the NVIDIA-only unit (no char-kfd, char-drm, char-accel, no render group), under
    which amdsmi and HLML find no device on an AMD or Gaudi node."""
    agent = (UNITS / "fleetfit-agent.service").read_text()
    assert {"render", "video"} <= set(_directives(agent, "SupplementaryGroups"))
    allowed = set(_directives(agent, "DeviceAllow"))
    assert {"char-nvidia*", "char-kfd", "char-drm", "char-accel", "char-habanalabs"} <= allowed
    assert _directives(agent, "CapabilityBoundingSet") == [] and _directives(agent, "AmbientCapabilities") == []


def test_the_attribution_drop_in_grants_exactly_what_the_proc_reads_need(tmp_path: Path) -> None:
    """The opt-in drop-in, installed beside the unit: `systemd-analyze verify` passes, it grants CAP_SYS_PTRACE
    (another user's /proc/PID/fd links and /proc/PID/environ) and CAP_DAC_READ_SEARCH (their mode 0500/0400) and
    nothing else, and the exposure it costs is the one docs/operations.md states.

    Deliberate bug it catches: a drop-in missing either capability (the Gaudi holder scan then lists no fd
    directory, or reads no link), or one that also grants more."""
    unit = _installed(tmp_path, "fleetfit-agent.service")
    dropins = tmp_path / "fleetfit-agent.service.d"
    dropins.mkdir()
    conf = DROP_IN.read_text()
    (dropins / "attribution.conf").write_text(conf)
    for name in ("CapabilityBoundingSet", "AmbientCapabilities"):
        assert sorted(_directives(conf, name)) == ["CAP_DAC_READ_SEARCH", "CAP_SYS_PTRACE"], name
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert verify.returncode == 0, verify.stderr
    security = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert re.search(r"✗ CapabilityBoundingSet=~CAP_SYS_PTRACE", security.stdout), security.stdout[-2000:]
    found = re.search(r"Overall exposure level for fleetfit-agent.service: ([0-9.]+)", security.stdout)
    assert found, security.stdout[-2000:]
    assert f"`fleetfit-agent.service` with `attribution.conf` | {float(found.group(1))}" in DOCS.read_text()
