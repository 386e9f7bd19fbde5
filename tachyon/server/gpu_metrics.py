"""GPU memory and utilization from NVML, read when Prometheus scrapes (`nvidia-ml-py`, imported lazily).

No NVML library, no driver or no GPU: the collector yields no series at all (a CPU server's /metrics stays as it
was). Memory is what the whole device has in use, as `nvidia-smi` shows it, not only this process's share.
"""

from __future__ import annotations

import logging

from prometheus_client.core import GaugeMetricFamily

logger = logging.getLogger("tachyon")

MEMORY_USED, MEMORY_TOTAL, UTILIZATION = SERIES = (
    "tachyon:gpu_memory_used_bytes", "tachyon:gpu_memory_total_bytes", "tachyon:gpu_utilization_perc")


def open_nvml():
    """The pynvml module, initialised, or None where there is no GPU to read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        return pynvml
    except Exception as e:  # ImportError, NVMLError (no driver, no device): no GPU series
        logger.debug("no GPU metrics: %r", e)
        return None


class GPUCollector:
    def __init__(self, model_name: str, nvml=None):
        self.model_name = model_name
        self.nvml = nvml

    def collect(self):
        nvml = self.nvml
        if nvml is None:
            return
        labels = ["model_name", "gpu"]
        used = GaugeMetricFamily(MEMORY_USED, "GPU memory in use on the device.", labels=labels)
        total = GaugeMetricFamily(MEMORY_TOTAL, "GPU memory of the device.", labels=labels)
        util = GaugeMetricFamily(UTILIZATION, "Fraction of the last sample period in which a "
                                 "kernel ran on the device (NVML utilization.gpu / 100).", labels=labels)
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                key = [self.model_name, str(i)]
                used.add_metric(key, mem.used)
                total.add_metric(key, mem.total)
                util.add_metric(key, rates.gpu / 100)
        except Exception:  # a scrape must not fail because NVML did
            logger.exception("reading GPU metrics from NVML failed")
            return
        yield used
        yield total
        yield util
