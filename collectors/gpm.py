"""GPU Performance Monitoring (Hopper and newer): SM, tensor-core and DRAM activity from two GPM samples.

Plain utilisation only says a kernel was running; GPM says how much of the GPU it used, which tells a
tensor-core-bound training step from a memory-bound decode loop.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any

GPM_METRICS = {2: "sm_active", 5: "tensor_active", 10: "dram_active"}  # nvml.h NVML_GPM_METRIC_* ids


class GpmReader:
    """Keeps two sample buffers for one device and turns consecutive samples into activity percentages."""

    def __init__(self, nvml: ModuleType, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle
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
        """Activity since the previous call; empty on the first call or when GPM fails this time."""
        nvml = self._nvml
        try:
            nvml.nvmlGpmSampleGet(self._handle, self._current)
        except nvml.NVMLError:
            return {}
        out: dict[str, float] = {}
        if self._primed:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(GPM_METRICS)
            request.sample1 = self._previous
            request.sample2 = self._current
            for slot, metric in enumerate(GPM_METRICS):
                request.metrics[slot].metricId = metric
            try:
                result = nvml.nvmlGpmMetricsGet(request)
            except nvml.NVMLError:
                result = None
            if result is not None:
                for slot in range(len(GPM_METRICS)):
                    m = result.metrics[slot]
                    if m.nvmlReturn == 0 and m.metricId in GPM_METRICS:
                        out[GPM_METRICS[m.metricId]] = float(m.value)
        self._previous, self._current = self._current, self._previous
        self._primed = True
        return out

    def close(self) -> None:
        for sample in (self._previous, self._current):
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlGpmSampleFree(sample)
