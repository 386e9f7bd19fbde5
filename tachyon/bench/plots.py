"""PNG plots (matplotlib, headless): throughput and latency vs concurrency; the ladder's bar chart."""

from __future__ import annotations

import os


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise ValueError("plots need matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_concurrency(series: dict[str, list[dict]], path: str, title: str = "") -> str:
    """series: label -> runs (each with 'concurrency' and 'metrics'). Three panels against concurrency."""
    plt = _plt()
    panels = [("output_throughput", "output tok/s"), ("median_ttft_ms", "median TTFT (ms)"),
              ("p99_e2el_ms", "P99 E2E latency (ms)")]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, (key, ylabel) in zip(axes, panels, strict=False):
        for label, runs in series.items():
            pts = sorted((r["concurrency"], r["metrics"].get(key)) for r in runs
                         if r.get("metrics") and r.get("concurrency") is not None and r["metrics"].get(key)
                         is not None)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_bars(runs: list[dict], path: str, title: str = "") -> str:
    """One bar per run: output tok/s and median TTFT; for results that have no concurrency axis."""
    plt = _plt()
    labels = [r["label"] for r in runs]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(runs) + 4), 4.5))
    for ax, (key, ylabel) in zip(axes, [("output_throughput", "output tok/s"), ("median_ttft_ms", "median TTFT (ms)")], strict=False):
        vals = [(r.get("metrics") or {}).get(key) or 0.0 for r in runs]
        ax.bar(range(len(runs)), vals)
        ax.set_xticks(range(len(runs)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    return _save(plt, fig, path, title)


def plot_ladder(steps: list[dict], path: str, title: str = "") -> str:
    """tok/s and memory per ladder step; a failed step is a hatched empty bar with its reason."""
    plt = _plt()
    n = len(steps)
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.3 * n + 3), 8), sharex=True)
    for ax, key, ylabel in [(axes[0], "tok_s", "output tok/s"), (axes[1], "memory_gib", "peak memory (GiB)")]:
        vals = [s.get(key) or 0.0 for s in steps]
        top = max(vals) if any(vals) else 1.0
        for i, (s, v) in enumerate(zip(steps, vals, strict=False)):
            if s.get("error"):
                ax.bar(i, top * 0.05, color="white", edgecolor="red", hatch="//")
                if ax is axes[0]:
                    ax.text(i, top * 0.07, "failed:\n" + _wrap(s["error"], 22), ha="center", va="bottom",
                            fontsize=6, color="red")
            else:
                ax.bar(i, v, color="tab:blue" if s["name"].startswith("hf") else "tab:orange")
                ax.text(i, v, f"{v:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.grid(True, axis="y", alpha=0.3)
    axes[1].set_xticks(range(n), [s["name"] for s in steps], rotation=30, ha="right", fontsize=8)
    return _save(plt, fig, path, title)


def _wrap(text: str, width: int) -> str:
    text = text[:3 * width]
    return "\n".join(text[i:i + width] for i in range(0, len(text), width))


def _save(plt, fig, path: str, title: str) -> str:
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
