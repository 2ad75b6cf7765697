"""Cache flamegraphs: per trace, where the engine kept and where it lost prefix reuse, over time.

Reads a cell's requests.jsonl (ARCHITECTURE §4) and draws, for each trace, an icicle chart:

* one lane per session (the parent on top, each sub-agent below it; repeated plays of a trace get
  their own lanes), every request a bar from dispatch to completion;
* inside a bar, the prompt split by the server's report: cached tokens (blue) at the bottom, computed
  tokens above; a black tick marks the theoretical hit (hash-id prefix, infinite cache) and the red
  hatched band between the cached top and that tick is reuse the engine lost;
* a lower panel with the same bars in absolute prompt tokens, so large misses stand out.

Requests without server usage are grey; failed requests are drawn as red crosses.
``index.html`` lists every trace (worst loss first) with its figures and links to the PNGs.
"""

from __future__ import annotations

import html
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kv_cache_tester.replay import REQUESTS_FILE, RecordReader, RequestRecord, ResultError

from agentsweep.errors import InputError

CACHED = "#3b78b0"
COMPUTED = "#f2b36b"
LOST = "#d1453b"
NO_USAGE = "#b9b9b9"


@dataclass(slots=True)
class Req:
    lane: str
    start: float
    end: float
    prompt: int
    cached: int | None  # None: the server gave no usage
    theoretical: float  # fraction of the prompt a perfect cache would hold
    ok: bool
    warmup: bool

    @property
    def cached_frac(self) -> float | None:
        if self.cached is None or self.prompt <= 0:
            return None
        return min(1.0, self.cached / self.prompt)

    @property
    def lost_tokens(self) -> float:
        frac = self.cached_frac
        if frac is None:
            return 0.0
        return max(0.0, self.theoretical - frac) * self.prompt


@dataclass
class TraceView:
    trace_id: str
    requests: list[Req] = field(default_factory=list)

    @property
    def lanes(self) -> list[str]:
        first: dict[str, float] = {}
        for r in self.requests:
            first[r.lane] = min(first.get(r.lane, r.start), r.start)
        return sorted(first, key=lambda lane: (":" in lane.split(" ", 1)[-1], first[lane], lane))

    def totals(self) -> dict[str, float]:
        rep = [r for r in self.requests if r.ok and r.cached is not None]
        prompt = sum(r.prompt for r in rep)
        cached = sum(r.cached or 0 for r in rep)
        theo = sum(r.theoretical * r.prompt for r in rep)
        return {
            "requests": len(self.requests),
            "failed": sum(1 for r in self.requests if not r.ok),
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "server_hit": cached / prompt if prompt else float("nan"),
            "theoretical_hit": theo / prompt if prompt else float("nan"),
            "lost_tokens": sum(r.lost_tokens for r in rep),
        }


def parse_record(rec: RequestRecord) -> tuple[str, Req]:
    """(trace id, the drawn request) of one record."""
    start = rec["t_dispatch"]
    e2e, done = rec.get("e2e_s"), rec.get("t_done")
    end = done if done is not None else start + (e2e or 0.0)
    prompt = rec.get("prompt_tokens") or 0
    cached = rec.get("cached_tokens")
    if rec.get("prompt_tokens_source", "server") != "server":
        cached = None
    hit = rec.get("theoretical_hit_blocks") or 0
    blocks = rec.get("total_blocks") or 0
    session = rec.get("session_id") or rec["trace_id"]
    play = rec.get("play")
    lane = f"play {play} {session}" if play not in (None, 0) else session
    return rec["trace_id"], Req(
        lane=lane,
        start=start,
        end=max(end, start),
        prompt=prompt,
        cached=cached,
        theoretical=min(1.0, hit / blocks) if blocks > 0 else 0.0,
        ok=rec.get("status") == "ok",
        warmup=rec.get("phase") == "warmup",
    )


def load_requests(path: Path) -> dict[str, TraceView]:
    """Traces of a requests.jsonl, read through the replayer's reader: a line that is not a record is
    an InputError naming it, except a last line torn by a hard kill (skipped, as summary.json does)."""
    if not path.is_file():
        raise InputError(f"{path}: no such file (expected a cell's {REQUESTS_FILE})")
    views: dict[str, TraceView] = {}
    try:
        for rec in RecordReader(path, strict=True, where=str(path)):
            trace, req = parse_record(rec)
            views.setdefault(trace, TraceView(trace)).requests.append(req)
    except ResultError as err:
        raise InputError(str(err)) from None
    if not views:
        raise InputError(f"{path}: no requests")
    return views


def safe_name(trace_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", trace_id)[:120] or "trace"


def _fmt_tokens(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


def draw_trace(view: TraceView, out: Path) -> Path:
    """Write ``out`` (PNG) for one trace."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    lanes = view.lanes
    row = {lane: i for i, lane in enumerate(lanes)}
    t0 = min(r.start for r in view.requests)
    t1 = max(r.end for r in view.requests)
    span = max(t1 - t0, 1e-6)
    min_w = span / 400.0  # keep a short request visible
    tick_w = span / 150.0  # token panel: a narrow bar at each dispatch, so parallel requests stay apart
    height = 2.2 + 0.55 * len(lanes) + 2.4
    fig, (ax, ax2) = plt.subplots(
        2,
        1,
        figsize=(13, height),
        sharex=True,
        gridspec_kw={"height_ratios": [max(1.2, 0.55 * len(lanes)), 2.4]},
    )
    bar_h = 0.8
    for r in view.requests:
        x = r.start - t0
        w = max(r.end - r.start, min_w)
        y = row[r.lane] - bar_h / 2
        alpha = 0.55 if r.warmup else 1.0
        if not r.ok:
            ax.plot(x + w / 2, row[r.lane], marker="x", color=LOST, markersize=7, mew=2)
            continue
        frac = r.cached_frac
        if frac is None:
            ax.broken_barh([(x, w)], (y, bar_h), facecolors=NO_USAGE, alpha=alpha)
            ax2.bar(x, r.prompt, width=tick_w, align="edge", color=NO_USAGE, alpha=alpha)
            continue
        # lane panel: fractions of the prompt (cached at the bottom)
        ax.broken_barh([(x, w)], (y, bar_h * frac), facecolors=CACHED, alpha=alpha)
        ax.broken_barh([(x, w)], (y + bar_h * frac, bar_h * (1 - frac)), facecolors=COMPUTED, alpha=alpha)
        if r.theoretical > frac + 1e-9:
            ax.broken_barh(
                [(x, w)],
                (y + bar_h * frac, bar_h * (r.theoretical - frac)),
                facecolors="none",
                edgecolors=LOST,
                hatch="////",
                linewidth=0,
            )
        ax.hlines(y + bar_h * r.theoretical, x, x + w, colors="black", linewidth=1.2)
        # token panel: absolute prompt tokens
        cached = r.cached or 0
        ax2.bar(x, cached, width=tick_w, align="edge", color=CACHED, alpha=alpha)
        ax2.bar(x, r.prompt - cached, bottom=cached, width=tick_w, align="edge", color=COMPUTED, alpha=alpha)
        theo = r.theoretical * r.prompt
        if theo > cached:
            ax2.bar(
                x,
                theo - cached,
                bottom=cached,
                width=tick_w,
                align="edge",
                color="none",
                edgecolor=LOST,
                hatch="////",
                linewidth=0,
            )
        ax2.hlines(theo, x, x + tick_w, colors="black", linewidth=1.2)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([_short(lane) for lane in lanes], fontsize=9)
    ax.set_ylim(len(lanes) - 0.5, -0.5)  # icicle: parent on top
    ax.set_ylabel("session")
    ax.grid(axis="x", alpha=0.3)
    ax2.set_ylabel("prompt tokens (at dispatch)")
    ax2.set_xlabel("seconds since the trace's first request")
    ax2.grid(axis="y", alpha=0.3)
    ax2.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: _fmt_tokens(v)))
    ax2.set_xlim(-span * 0.01, span * 1.01)
    tot = view.totals()
    server_text = f"{tot['server_hit']:.1%}" if tot["prompt_tokens"] else "n/a"
    theo_text = f"{tot['theoretical_hit']:.1%}" if tot["prompt_tokens"] else "n/a"
    ax.set_title(
        f"{view.trace_id}: {tot['requests']} requests ({tot['failed']} failed) · server hit {server_text} "
        f"vs theoretical {theo_text} · lost {_fmt_tokens(tot['lost_tokens'])} tokens",
        fontsize=11,
        loc="left",
    )
    handles = [
        Patch(color=CACHED, label="cached (server)"),
        Patch(color=COMPUTED, label="computed"),
        Patch(facecolor="white", edgecolor=LOST, hatch="////", label="lost reuse"),
        Patch(color="black", label="theoretical hit (tick)"),
        Patch(color=NO_USAGE, label="no server usage"),
        Line2D([], [], color=LOST, marker="x", linestyle="none", mew=2, label="failed request"),
    ]
    fig.legend(handles=handles, loc="lower center", ncol=6, frameon=False, fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _short(lane: str, limit: int = 28) -> str:
    return lane if len(lane) <= limit else "…" + lane[-(limit - 1) :]


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x:.1%}"


def write_index(rows: list[tuple[TraceView, str | None]], out_dir: Path, title: str) -> Path:
    body = []
    for view, png in rows:
        t = view.totals()
        link = (
            f'<a href="{html.escape(png)}">{html.escape(view.trace_id)}</a>'
            if png
            else html.escape(view.trace_id)
        )
        body.append(
            f"<tr><td>{link}</td><td>{t['requests']}</td><td>{t['failed']}</td>"
            f"<td>{_pct(t['server_hit'])}</td><td>{_pct(t['theoretical_hit'])}</td>"
            f"<td>{_fmt_tokens(t['lost_tokens'])}</td></tr>"
        )
    images = "\n".join(
        f'<h2 id="{html.escape(safe_name(v.trace_id))}">{html.escape(v.trace_id)}</h2>'
        f'<img src="{html.escape(png)}" alt="{html.escape(v.trace_id)}" loading="lazy">'
        for v, png in rows
        if png
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}td:first-child{{text-align:left}}
img{{max-width:100%;border:1px solid #ddd}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>Per trace: server-reported cached vs computed prompt tokens of every request, against the theoretical
prefix hit (hash ids, infinite cache). Red hatching is reuse the engine lost. Worst loss first.</p>
<table><tr><th>trace</th><th>requests</th><th>failed</th><th>server hit</th><th>theoretical hit</th>
<th>lost tokens</th></tr>
{chr(10).join(body)}
</table>
{images}
</body></html>
"""
    path = out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def render(requests_path: Path, out_dir: Path, *, max_traces: int = 40) -> tuple[Path, list[Path]]:
    """PNG per trace (the ``max_traces`` with most lost tokens) plus index.html; returns (index, pngs)."""
    if max_traces < 1:
        raise InputError(f"--max-traces: must be >= 1, got {max_traces}")
    views = load_requests(requests_path)
    ordered = sorted(views.values(), key=lambda v: (-v.totals()["lost_tokens"], v.trace_id))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[TraceView, str | None]] = []
    pngs = []
    used: defaultdict[str, int] = defaultdict(int)
    for k, view in enumerate(ordered):
        if k >= max_traces:
            rows.append((view, None))
            continue
        name = safe_name(view.trace_id)
        used[name] += 1
        if used[name] > 1:
            name = f"{name}~{used[name]}"
        png = draw_trace(view, out_dir / f"{name}.png")
        pngs.append(png)
        rows.append((view, png.name))
    title = f"Cache flamegraphs: {requests_path.parent.name or requests_path}"
    return write_index(rows, out_dir, title), pngs
