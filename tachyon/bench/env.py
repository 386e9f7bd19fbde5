"""What a result needs beside its figures: hardware, versions, git commit, machine load, the command."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def _version(pkg: str) -> str | None:
    try:
        import importlib.metadata

        return importlib.metadata.version(pkg)
    except Exception:
        return None


def git_info() -> dict:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = {}
    try:
        out["commit"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                       timeout=5).stdout.strip() or None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                capture_output=True, text=True, timeout=5).stdout
        out["dirty"] = bool(status.strip())
    except Exception:
        out["commit"] = None
    return out


def loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment() -> dict:
    import torch

    env = {
        "hardware": {"cpu": _cpu_model(), "cpu_cores": os.cpu_count(), "memory_gib": _mem_gib(),
                     "torch_threads": torch.get_num_threads()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": _version("transformers"), "tachyon": _version("tachyon")},
        "git": git_info(),
        "platform": platform.platform(),
    }
    if torch.cuda.is_available():
        env["hardware"]["gpu"] = torch.cuda.get_device_name(0)
        env["hardware"]["gpu_count"] = torch.cuda.device_count()
        env["hardware"]["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)
        env["versions"]["cuda"] = torch.version.cuda
    return env


def command_line(argv: list[str] | None = None) -> str:
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(("tachyon", "cli.py")):
        argv[0] = "tachyon"
    return shlex.join(argv)


def timestamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def iso_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
