"""The environment switches, each with its default and meaning in one place. A knob a user sets for a run is an
EngineArgs field (tachyon/engine_args.py); these are A/B switches for kernels and policies whose default a GPU run
decides, so that a benchmark can flip one without a code change. Each takes 0 or 1 (unset or empty: the default);
`check` runs at engine start-up, so a bad value stops the start with a message, never a step."""

from __future__ import annotations

import os

# name -> (default, meaning); a default of None: unset means "decided by the hardware" (the reader says how)
FLAGS: dict[str, tuple[bool | None, str]] = {
    "TACHYON_GEMV_SPLIT": (False, "the start-up gemv tuner also times the K-split configs (2-64 rows): off until a "
                                  "GPU run has measured them (benchmarks/gemv_tune_check.py)"),
    "TACHYON_SPLIT_FINISH": (False, "a split-K one-row walk sums its own partials (the tile's last split) instead of "
                                    "a second kernel"),
    "TACHYON_FINE_BUCKETS": (True, "piecewise-graph buckets from 256 to 2,048 tokens chosen by the linears' cost, "
                                   "timed every 8 rows at start-up; 0 keeps the plain grid"),
    "TACHYON_FUSED_QUANT": (False, "norms and activations that feed an 8-bit linear also write its quantized input"),
    "TACHYON_AWQ_MMA": (None, "AWQ layers repacked K-major for kernels/awq_mma.py: unset, on Hopper (sm_90) only; "
                              "1, on any card from sm_90; 0, never"),
}


def flag(name: str) -> bool | None:
    """The switch's value: True for 1, False for 0, its default when unset or empty."""
    default, _ = FLAGS[name]
    raw = os.environ.get(name, "")
    if raw == "":
        return default
    if raw not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {raw!r} ({FLAGS[name][1]})")
    return raw == "1"


def check() -> None:
    """Raise ValueError naming every switch set to something other than 0 or 1."""
    bad = []
    for name in FLAGS:
        try:
            flag(name)
        except ValueError as e:
            bad.append(str(e))
    if bad:
        raise ValueError("; ".join(bad))
