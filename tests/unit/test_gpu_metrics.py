"""GPU series on /metrics come from NVML: the values it reports, and no series at all without a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from tachyon.server.gpu_metrics import SERIES, GPUCollector, open_nvml  # noqa: E402


class FakeNVML:
    """Two devices, as pynvml reports them."""

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30, free=0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=97 if h == 0 else 3, memory=0)


def _scrape(collector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_gpu_series_from_nvml():
    text = _scrape(GPUCollector("m", FakeNVML()))
    assert 'tachyon:gpu_memory_used_bytes{gpu="1",model_name="m"} 2.147483648e+09' in text
    assert 'tachyon:gpu_memory_total_bytes{gpu="0",model_name="m"} 8.589934592e+10' in text
    assert 'tachyon:gpu_utilization_perc{gpu="0",model_name="m"} 0.97' in text
    assert {line.split("{")[0] for line in text.splitlines() if not line.startswith("#")} == set(SERIES)


def test_no_gpu_no_series():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert open_nvml() is None
    assert "gpu" not in _scrape(GPUCollector("m", open_nvml()))


def test_nvml_failing_mid_scrape_gives_no_series():
    class Broken(FakeNVML):
        def nvmlDeviceGetMemoryInfo(self, h):
            raise RuntimeError("GPU is lost")

    assert "gpu" not in _scrape(GPUCollector("m", Broken()))
