"""ttft_throughput.png: TTFT of every request and completed throughput over run time.

matplotlib is optional (extra ``plots``); without it the plot is skipped with a note.
"""

from __future__ import annotations

from pathlib import Path

from kv_cache_tester.replay.results import REQUESTS_FILE
from kv_cache_tester.replay.summary import read_records

PLOT_FILE = "ttft_throughput.png"


def write_plot(out_dir: Path) -> str | None:
    """Write the plot; returns a note when it was skipped."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return f"matplotlib is not installed: skipped {PLOT_FILE} (pip install 'kv-cache-tester[plots]')"
    records = read_records(out_dir / REQUESTS_FILE)
    ok = [r for r in records if r["status"] == "ok" and r["ttft_s"] is not None]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    for phase, color in (("warmup", "tab:gray"), ("profile", "tab:blue")):
        rows = [r for r in ok if r["phase"] == phase]
        if rows:
            ax1.plot(
                [r["t_dispatch"] for r in rows],
                [r["ttft_s"] for r in rows],
                ".",
                markersize=2,
                color=color,
                label=phase,
            )
    ax1.set_ylabel("TTFT (s)")
    ax1.set_yscale("log")
    if ok:
        ax1.legend(loc="upper left", markerscale=4)
    end = max((r["t_done"] for r in records), default=0.0)
    nbins = max(1, int(end) + 1)
    reqs = [0] * nbins
    toks = [0.0] * nbins
    for r in ok:
        b = min(nbins - 1, int(r["t_done"]))
        reqs[b] += 1
        toks[b] += (r["output_tokens"] or 0) / 1000.0
    xs = list(range(nbins))
    ax2.plot(xs, reqs, color="tab:green", label="requests/s")
    ax2.set_ylabel("requests/s")
    ax2.set_xlabel("time since start (s)")
    ax3 = ax2.twinx()
    ax3.plot(xs, toks, color="tab:orange", label="output ktok/s")
    ax3.set_ylabel("output ktok/s")
    fig.suptitle(f"{len(ok)} ok / {len(records)} requests")
    fig.subplots_adjust(left=0.08, right=0.92, bottom=0.09, top=0.93, hspace=0.08)
    fig.savefig(out_dir / PLOT_FILE, dpi=100)
    plt.close(fig)
    return None
