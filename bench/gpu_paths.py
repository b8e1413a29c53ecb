"""The GPU collector's driver paths checked on a real NVIDIA GPU (run by bench/gpu_check.py, or alone with
``bench/gpu_check.py --paths``).

These paths are tested against a stand-in NVML; on a real GPU they are checked as follows:

* ``layout checks``: the collector runs with a clock that makes a layout check (driver, GPU count, MIG layout,
  NVLink links up) every two seconds. On a GPU nobody reconfigures, none may find a change (no new birth), no
  counter may reset and no GPU may fail.
* ``mps``: an MPS control daemon with a private pipe directory (other CUDA programs on the machine do not see
  it) and two PyTorch clients in sessions of their own. NVML's MPS process call must list both clients, the
  compute process call the MPS server, and the collector must attribute the clients. Skipped without
  ``nvidia-cuda-mps-control`` or PyTorch; the daemon is stopped afterwards.
* ``mig`` (only with ``--allow-mig-change``): on GPU 0, when MIG is supported, off and no process uses the GPU,
  MIG is enabled, one 1g GPU instance and its compute instance are created, and the collector must announce the
  instance (a new birth listing it under GPU 0); everything is destroyed and MIG disabled afterwards.
* ``reset`` (only with ``--allow-reset``): ``nvidia-smi --gpu-reset -i 0`` while the collector samples; it must
  keep sampling, report GPU 0 again afterwards, and its counters must not spike.

Changing MIG or resetting a GPU disturbs whoever else uses the machine: both are off unless asked for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.window import WindowBuilder
from collectors.attribution import Attributor
from collectors.gpu import RESCAN_S, NvmlGpuCollector, open_gpu_collector

CLIENT = """
import sys, time
import torch
x = torch.randn(2048, 2048, device="cuda")
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    x @ x
    torch.cuda.synchronize()
    time.sleep(0.01)
"""


@dataclass(frozen=True, slots=True)
class Result:
    check: str
    verdict: str  # "pass", "FAIL" or "skipped"
    detail: str

    def line(self) -> str:
        return f"paths: {self.check}: {self.verdict} ({self.detail})"


class FastClock:
    """Monotonic time running ``RESCAN_S / 2`` times faster than the wall: a layout check every two seconds."""

    def __init__(self) -> None:
        self._start = time.monotonic()

    def __call__(self) -> float:
        return self._start + (time.monotonic() - self._start) * RESCAN_S / 2


def _collector(clock: Callable[[], float]) -> NvmlGpuCollector:
    collector = open_gpu_collector(attributor=Attributor(node="gpu-check"), clock=clock)
    if not isinstance(collector, NvmlGpuCollector):
        raise SystemExit(f"no GPU to check: {collector.reason}")
    return collector


def _sample(collector: NvmlGpuCollector, seconds: float, builder: WindowBuilder | None = None) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples = collector.sample()
        if builder is not None:
            builder.add(samples, time.monotonic())
        time.sleep(1.0)


def check_layout(seconds: float = 12.0) -> Result:
    collector = _collector(FastClock())
    before = [(g.index, g.nvlink_links, g.nvswitch, g.mig_profile) for g in collector.inventory().gpus]
    builder = WindowBuilder("gpu-check", "check", 1)
    _sample(collector, seconds, builder)
    after = [(g.index, g.nvlink_links, g.nvswitch, g.mig_profile) for g in collector.inventory().gpus]
    checks = int(seconds / 2)
    failed = len(collector.inventory().gpu_failures)
    detail = (
        f"{checks} layout checks: {collector.generation} inventory change(s), {collector.counter_resets} GPU "
        f"counter reset(s), {builder.counter_resets} rate reset(s), {failed} failed GPU(s); NVLink links up "
        f"{[links for _, links, _, _ in after]}"
    )
    collector.close()
    ok = collector.generation == 0 and collector.counter_resets == 0 and builder.counter_resets == 0
    return Result("layout checks", "pass" if ok and before == after and not failed else "FAIL", detail)


def _pids(call: Callable[[Any], Any], handle: Any) -> set[int]:
    return {int(p.pid) for p in call(handle)}


def check_mps(seconds: float = 20.0) -> Result:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        return Result("mps", "skipped", "nvidia-cuda-mps-control is not installed")
    try:
        import torch  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        return Result("mps", "skipped", "PyTorch is not installed")
    import pynvml

    with tempfile.TemporaryDirectory() as pipes, tempfile.TemporaryDirectory() as logs:
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=pipes, CUDA_MPS_LOG_DIRECTORY=logs)
        started = subprocess.run([control, "-d"], env=env, capture_output=True, timeout=30, check=False)
        if started.returncode != 0:
            return Result("mps", "skipped", f"the MPS daemon did not start: {started.stderr.decode()[-200:]}")
        clients: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(2):
                clients.append(
                    subprocess.Popen(
                        [sys.executable, "-c", CLIENT, str(seconds)], env=env, start_new_session=True
                    )  # each its own session: the process group a bare machine attributes by
                )
            time.sleep(min(10.0, seconds / 2))  # CUDA contexts through the MPS server
            collector = _collector(time.monotonic)
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            mps = _pids(pynvml.nvmlDeviceGetMPSComputeRunningProcesses, handle)
            compute = _pids(pynvml.nvmlDeviceGetComputeRunningProcesses, handle)
            attributed = {
                pid for d in collector._devices for pid, _ in collector._device_pids(d) if isinstance(pid, int)
            }
            workloads = collector.workloads()
            collector.close()
        finally:
            for c in clients:
                c.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.wait(timeout=30)
            subprocess.run([control], input=b"quit\n", env=env, capture_output=True, timeout=30, check=False)
    wanted = {c.pid for c in clients}
    detail = (
        f"clients {sorted(wanted)}; NVML's MPS call lists {sorted(mps)}, its compute call {sorted(compute)}; the "
        f"collector attributes {sorted(wanted & attributed)} of the clients, as {[w.id for w in workloads]}"
    )
    return Result("mps", "pass" if wanted <= mps and wanted <= attributed else "FAIL", detail)


def check_mig(allowed: bool, seconds: float = 8.0) -> Result:
    if not allowed:
        return Result("mig", "skipped", "--allow-mig-change not given")
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    try:
        current, _ = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError as exc:
        return Result("mig", "skipped", f"GPU 0 has no MIG: {exc}")
    if current:
        return Result("mig", "skipped", "GPU 0 is in MIG mode already: left as it is")
    if pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
        return Result("mig", "skipped", "processes use GPU 0")
    try:
        pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_ENABLE)
    except pynvml.NVMLError as exc:
        return Result("mig", "skipped", f"MIG cannot be enabled here: {exc}")
    instances: list[tuple[Callable[[Any], Any], Any]] = []
    try:
        current, pending = pynvml.nvmlDeviceGetMigMode(handle)
        if not current:
            return Result("mig", "skipped", f"enabling MIG waits for a GPU reset (pending {pending}): reverted")
        collector = _collector(FastClock())
        _sample(collector, 3.0)
        profile = pynvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)
        gpu_instance = pynvml.nvmlDeviceCreateGpuInstance(handle, profile.id)
        instances.append((pynvml.nvmlGpuInstanceDestroy, gpu_instance))
        compute = pynvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
            gpu_instance,
            pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
            pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
        )
        instances.insert(0, (pynvml.nvmlComputeInstanceDestroy, pynvml.nvmlGpuInstanceCreateComputeInstance(
            gpu_instance, compute.id
        )))  # fmt: skip
        _sample(collector, seconds)
        listed = [g for g in collector.inventory().gpus if g.parent == 0]
        collector.close()
    finally:
        for destroy, instance in instances:
            with contextlib.suppress(pynvml.NVMLError):
                destroy(instance)
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlDeviceSetMigMode(handle, pynvml.NVML_DEVICE_MIG_DISABLE)
    profiles = [g.mig_profile for g in listed]
    ok = collector.generation >= 1 and any(p and p.startswith("1g.") for p in profiles)
    return Result("mig", "pass" if ok else "FAIL", f"{collector.generation} new birth(s); GPU 0's instances {profiles}")


def check_reset(allowed: bool, seconds: float = 15.0) -> Result:
    if not allowed:
        return Result("reset", "skipped", "--allow-reset not given")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Result("reset", "skipped", "nvidia-smi is not installed")
    collector = _collector(FastClock())
    builder = WindowBuilder("gpu-check", "check", 1)
    _sample(collector, 3.0, builder)
    reset = subprocess.run([smi, "--gpu-reset", "-i", "0"], capture_output=True, timeout=120, check=False)
    if reset.returncode != 0:
        collector.close()
        return Result("reset", "skipped", f"nvidia-smi --gpu-reset: {(reset.stdout + reset.stderr).decode()[-200:]}")
    _sample(collector, seconds, builder)
    last = {s.key: s for s in collector.sample()}
    window = builder.close(0, 0.0, seconds + 3.0, [])
    peaks = [g.pcie_tx_bps.max for g in window.gpus if g.index == 0 and g.pcie_tx_bps is not None]
    collector.close()
    back = "0" in last and "util" in last["0"].gauges
    plausible = all(p < 128e9 for p in peaks)  # PCIe 5 x16 moves 64 GB/s a direction: a spike is a reset read wrong
    detail = f"GPU 0 answers again: {back}; {builder.counter_resets} counter reset(s) skipped; PCIe peaks {peaks}"
    return Result("reset", "pass" if back and plausible else "FAIL", detail)


def run(allow_mig_change: bool, allow_reset: bool) -> list[Result]:
    """Every check, in an order that leaves the GPU as it found it; each prints its line as it ends."""
    results = []
    checks: tuple[Callable[[], Result], ...] = (
        check_layout,
        check_mps,
        lambda: check_mig(allow_mig_change),
        lambda: check_reset(allow_reset),
    )
    for check in checks:
        result = check()
        print(result.line(), flush=True)
        results.append(result)
    return results
