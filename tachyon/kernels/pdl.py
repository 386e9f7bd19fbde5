"""Programmatic dependent launch (PDL, Hopper and later): overlap a kernel's launch with the end of the one
before it in the stream.

A decode step of a small batch is some 300 short kernels back to back; between two of them the GPU normally
drains the first grid completely before it starts placing the second one's programs, a few microseconds each
time. Launched with PDL, the second grid is placed as soon as every program of the first has started (they
call `griddepcontrol.launch_dependents` on entry), and its programs then block in `griddepcontrol.wait` until
the first grid has finished and its writes are visible. Every Tachyon kernel calls `enter(PDL)` before it
touches memory, so a PDL launch behaves exactly like a plain one except for when its programs get placed;
a kernel launched after a non-PDL kernel (cuBLAS, torch) simply waits for it as usual.

`enable` is process-wide and off by default: the GPU runner (where `supported`) turns it on only while it
captures a decode CUDA graph's PDL variant (worker/cuda_graphs.py); `launch_args` is what each launcher passes
to its kernel.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_enabled = False


def supported(device: torch.device) -> bool:
    """PDL needs an sm_90+ CUDA device and compiled kernels (the interpreter has no griddepcontrol)."""
    return (device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
            and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))


def enable(on: bool) -> None:
    global _enabled
    _enabled = bool(on)


def enabled() -> bool:
    return _enabled


def launch_args() -> dict:
    """Keyword arguments for a kernel launch: the kernel's PDL constexpr, and Triton's launch option."""
    return {"PDL": True, "launch_pdl": True} if _enabled else {"PDL": False}


@triton.jit
def enter(PDL: tl.constexpr):
    """First thing in every kernel: wait for the grid before (its writes visible), then let the next one be
    placed. A no-op when launched without PDL."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
