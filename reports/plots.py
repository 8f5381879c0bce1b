"""Plots for reports: a recovery's phases as a Gantt chart with the light at the new paths
beneath it, on one time axis (seconds after the fault). PNG and SVG.

matplotlib is imported on the first figure, not with this module: the suites import it, and a run
without a report makes no figure (reports/allure_glue.py: attach_figure), where the import alone
would cost about half a second of CPU in every process that collects the suites."""

from __future__ import annotations

import functools
import io

from lumion_hil.harness.recovery_model import PHASES


@functools.cache
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def recovery_figure(phases: dict[str, tuple[int, int]], fault_ns: int, light: dict[str, list[tuple[int, float | None]]],
                    title: str = "recovery", sensitivity_dbm: float | None = None):
    fig, (ax_phase, ax_light) = _pyplot().subplots(2, 1, figsize=(9, 5.5), sharex=True,
                                                   gridspec_kw={"height_ratios": [3, 2]})
    names = [p for p in PHASES if p in phases]
    for row, name in enumerate(names):
        start, end = phases[name]
        left = (start - fault_ns) / 1e9
        width = max((end - start) / 1e9, 1e-5)
        ax_phase.barh(row, width, left=left, height=0.6, color=f"C{row % 10}")
        ax_phase.text(left + width, row, f" {width * 1e3:.1f} ms", va="center", fontsize=8)
    ax_phase.set_yticks(range(len(names)), names)
    ax_phase.invert_yaxis()
    ax_phase.axvline(0, color="red", linestyle="--", linewidth=1)
    ax_phase.set_title(title)
    ax_phase.set_ylabel("phase")
    for name, samples in light.items():
        points = [((t - fault_ns) / 1e9, v) for t, v in samples if v is not None]
        if points:
            xs, ys = zip(*points)
            ax_light.plot(xs, ys, drawstyle="steps-post", label=name, linewidth=1)
    if sensitivity_dbm is not None:
        ax_light.axhline(sensitivity_dbm, color="grey", linestyle=":", linewidth=1, label="receiver sensitivity")
    ax_light.axvline(0, color="red", linestyle="--", linewidth=1)
    ax_light.set_ylabel("power (dBm)")
    ax_light.set_xlabel("time after the fault (s)")
    if light:
        ax_light.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def render(fig, fmt: str) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=110)
    return buf.getvalue()


def close(fig) -> None:
    _pyplot().close(fig)


def busbw_figure(series: dict[str, dict[int, float]], title: str = "bus bandwidth by message size"):
    """nccl-tests' busbw against message size, one line per fabric or moment (log x)."""
    fig, ax = _pyplot().subplots(figsize=(8, 4.5))
    for k, (label, by_size) in enumerate(series.items()):
        sizes = sorted(s for s in by_size if s > 0)
        ax.plot(sizes, [by_size[s] for s in sizes], marker="o", markersize=3, linewidth=1.2, label=label,
                color=f"C{k % 10}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
