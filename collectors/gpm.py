"""GPU Performance Monitoring (Hopper and newer): SM, tensor-core and DRAM activity and SM occupancy from two GPM
samples.

Plain utilisation only says a kernel was running; GPM says how much of the GPU it used, which tells a
tensor-core-bound training step from a memory-bound decode loop. SM occupancy (warps resident against the most
the SMs hold) tells a GPU kept full from one whose SMs each run a few warps (small batches). GPM also samples
each MIG instance on its own (``nvmlGpmMigSampleGet``), where NVML's utilisation is not supported at all, and
gives PCIe throughput in MiB/s on drivers older than the PCIe byte fields.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

# nvml.h NVML_GPM_METRIC_* ids → the names the collector reads them under. SM occupancy (3) rides in the same
# nvmlGpmMetricsGet call as the others: one more slot, no more calls.
GPM_ACTIVITY = {1: "gpm_util", 2: "sm_active", 3: "sm_occupancy", 5: "tensor_active", 10: "dram_active"}
GPM_PCIE = {20: "pcie_tx_mibps", 21: "pcie_rx_mibps"}
# NVLink-C2C payload to and from the Grace CPU (NVML_GPM_METRIC_C2C_DATA_TX/RX_PER_SEC), asked of GPUs with the link
GPM_C2C = {102: "c2c_tx_mibps", 103: "c2c_rx_mibps"}


class GpmReader:
    """Keeps two sample buffers for one device (or one MIG instance) and turns consecutive samples into values."""

    def __init__(
        self,
        nvml: ModuleType,
        handle: Any,
        instance: int | None = None,
        metrics: dict[int, str] | None = None,
    ) -> None:
        self._nvml = nvml
        self._errors = (nvml.NVMLError, AttributeError)
        self._metrics = dict(metrics or GPM_ACTIVITY)
        self._get: Callable[[Any], Any]
        if instance is None:
            self._get = lambda buf: nvml.nvmlGpmSampleGet(handle, buf)
        else:  # handle is the parent GPU; the instance is its GPU-instance id
            self._get = lambda buf: nvml.nvmlGpmMigSampleGet(handle, instance, buf)
        self._previous = nvml.nvmlGpmSampleAlloc()
        self._current = nvml.nvmlGpmSampleAlloc()
        self._primed = False

    @staticmethod
    def supported(nvml: ModuleType, handle: Any) -> bool:
        if not hasattr(nvml, "nvmlGpmQueryDeviceSupport"):
            return False
        try:
            return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except nvml.NVMLError:
            return False

    def read(self) -> dict[str, float]:
        """Values since the previous call; empty on the first call or when GPM fails this time."""
        nvml = self._nvml
        try:
            self._get(self._current)
        except self._errors:
            return {}
        out: dict[str, float] = {}
        if self._primed:
            ids = list(self._metrics)
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(ids)
            request.sample1 = self._previous
            request.sample2 = self._current
            for slot, metric in enumerate(ids):
                request.metrics[slot].metricId = metric
            try:
                result = nvml.nvmlGpmMetricsGet(request)
            except self._errors:
                result = None
            if result is not None:
                for slot in range(len(ids)):
                    m = result.metrics[slot]
                    if m.nvmlReturn == 0 and m.metricId in self._metrics:
                        out[self._metrics[m.metricId]] = float(m.value)
        self._previous, self._current = self._current, self._previous
        self._primed = True
        return out

    def close(self) -> None:
        for sample in (self._previous, self._current):
            with contextlib.suppress(*self._errors):
                self._nvml.nvmlGpmSampleFree(sample)
