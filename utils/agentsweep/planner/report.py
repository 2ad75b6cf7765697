"""A plan's answer: per tier and hardware the boundary agents per GPU and per MW, what binds it, the
KV cliff, tok/s per GPU there, and the calibration each figure rests on with the band its held-out
error implies. Written as plan.csv, plan.png and plan.html (offline: the figure is inlined)."""

from __future__ import annotations

import base64
import html
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from kv_cache_tester.metrics import finite

from agentsweep.cell.engines.sim import WEIGHT_PRECISION
from agentsweep.collect.output import save_figure
from agentsweep.contract.cell import Cell
from agentsweep.contract.hardware import hardware_label
from agentsweep.contract.resultdir import read_capacity
from agentsweep.engine_sim.profiles import calibration_for, find_model, held_out_errors, precision_of
from agentsweep.planner.run import finished

PLAN_CSV, PLAN_PNG, PLAN_HTML = "plan.csv", "plan.png", "plan.html"


@dataclass(frozen=True, slots=True)
class PlanRow:
    hardware: str  # simulated B300
    tp: int
    replicas: int  # engines of tp GPUs each (1: one engine, no router)
    offload: str
    tier: str
    tier_description: str
    agents_per_gpu: float | None
    agents_per_mw: float | None
    boundary_type: str
    binding: str | None
    past_kv_cliff: bool
    output_tok_per_s_per_gpu: float | None
    total_tok_per_s_per_gpu: float | None
    band: float | None  # relative: the largest median held-out error of the calibration it rests on
    calibration: str  # where the step model's coefficients come from
    exp_name: str


def plan_rows(cells: list[Cell], root: Path) -> list[PlanRow]:
    """One row per cell and tier, from each finished search's capacity.json (a search that did not
    run to its end, interrupted or failed, is left out: its boundary is not known)."""
    rows: list[PlanRow] = []
    for cell in cells:
        record = read_capacity(root / cell.exp_name) if finished(root / cell.exp_name) else None
        if record is None:
            continue
        cal = calibration_for(cell.node.hardware, _precision(cell))
        errors = held_out_errors((cal.borrowed or cal).key) or {}
        for tier in record.tiers:
            rows.append(
                PlanRow(
                    hardware=hardware_label(True, cell.node.hardware),
                    tp=cell.tp,
                    replicas=cell.replicas,
                    offload=cell.offload,
                    tier=tier.tier,
                    tier_description=tier.description,
                    agents_per_gpu=tier.agents_per_gpu,
                    agents_per_mw=tier.agents_per_mw,
                    boundary_type=tier.boundary_type,
                    binding=tier.binding,
                    past_kv_cliff=tier.cliff is not None,
                    output_tok_per_s_per_gpu=tier.output_tok_per_s_per_gpu,
                    total_tok_per_s_per_gpu=tier.total_tok_per_s_per_gpu,
                    band=max(errors.values()) if errors else None,
                    calibration=cal.describe(find_model(cell.model).key),
                    exp_name=cell.exp_name,
                )
            )
    return rows


def _precision(cell: Cell) -> str:
    """The weights precision the simulated engine ran with: the cell's, as its recipe passes it
    (``--quantization``), else the model's own (as the engine resolves it without the flag)."""
    stated = WEIGHT_PRECISION.get(cell.precision.lower())
    return stated or precision_of(cell.model, find_model(cell.model).native_precision)


def write_plan(rows: list[PlanRow], out: Path, title: str) -> list[Path]:
    """plan.csv, plan.png and plan.html in ``out``; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    df = pd.DataFrame([asdict(r) for r in rows])
    df.to_csv(out / PLAN_CSV, index=False)
    png = _figure(df, out / PLAN_PNG, title)
    (out / PLAN_HTML).write_text(_page(df, png, title), encoding="utf-8")
    return [out / PLAN_CSV, png, out / PLAN_HTML]


def _figure(df: pd.DataFrame, path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tiers = list(dict.fromkeys(df["tier"]))
    df = df.assign(
        label=[
            f"{h}\n{_shape(tp, n)} · {o}"
            for h, tp, n, o in zip(df.hardware, df.tp, df.replicas, df.offload, strict=True)
        ]
    )
    labels = list(dict.fromkeys(df["label"]))
    fig, axes = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(labels) + 3), 4.6))
    width = 0.8 / max(1, len(tiers))
    for ax, column, what in zip(
        axes, ("agents_per_gpu", "agents_per_mw"), ("agents per GPU", "agents per MW"), strict=True
    ):
        for k, tier in enumerate(tiers):
            part = df[df["tier"] == tier].set_index("label")
            xs = [i + (k - (len(tiers) - 1) / 2) * width for i in range(len(labels))]
            ys = [finite(part[column].get(label)) or 0.0 for label in labels]
            bands = [
                (finite(part["band"].get(label)) or 0.0) * y for label, y in zip(labels, ys, strict=True)
            ]
            ax.bar(xs, ys, width, label=tier)
            ax.errorbar(xs, ys, yerr=bands, fmt="none", ecolor="black", capsize=3, lw=0.8)
        ax.set_xticks(range(len(labels)), labels, fontsize=8)
        ax.set_ylabel(what)
        ax.set_title(f"{what} at the SLO boundary (simulated)", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(title="tier", fontsize=8)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


COLUMNS = (
    ("hardware", "Hardware"), ("tp", "TP"), ("replicas", "Replicas"), ("offload", "Offload"), ("tier", "Tier"),
    ("agents_per_gpu", "Agents / GPU"), ("agents_per_mw", "Agents / MW"), ("binding", "Bound by"),
    ("past_kv_cliff", "KV cliff"), ("output_tok_per_s_per_gpu", "Output tok/s / GPU"),
    ("total_tok_per_s_per_gpu", "Total tok/s / GPU"), ("band", "± (held-out error)"),
)  # fmt: skip


def cell_text(column: str, value: object) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "–"
    if column == "band":
        return f"±{float(value):.0%}"  # type: ignore[arg-type]
    if column == "past_kv_cliff":
        return "past it" if value else ""
    if isinstance(value, float):
        return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"
    return str(value)


def _shape(tp: int, replicas: int) -> str:
    """``TP 8``, or for replicas ``9 x TP 8`` (72 GPUs)."""
    return f"TP {tp}" if replicas <= 1 else f"{replicas} x TP {tp} ({replicas * tp} GPUs)"


def table_lines(rows: list[PlanRow]) -> list[str]:
    """The plan as plain lines, one per hardware and tier."""
    out = []
    for r in rows:
        per_mw = f", {r.agents_per_mw:,.0f} per MW" if r.agents_per_mw else ""
        band = f" (±{r.band:.0%})" if r.band else ""
        cliff = ", past the KV cliff" if r.past_kv_cliff else ""
        out.append(
            f"{r.hardware} {_shape(r.tp, r.replicas)} offload {r.offload}, tier {r.tier}: "
            f"{cell_text('agents_per_gpu', r.agents_per_gpu)} agents per GPU{band}{per_mw}, bound by "
            f"{r.binding or '–'}{cliff}; {cell_text('output_tok_per_s_per_gpu', r.output_tok_per_s_per_gpu)} "
            "output tok/s per GPU there"
        )
    return out


def _page(df: pd.DataFrame, png: Path, title: str) -> str:
    image = base64.b64encode(png.read_bytes()).decode()
    head = "".join(f"<th>{html.escape(label)}</th>" for _c, label in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell_text(c, row[c]))}</td>" for c, _l in COLUMNS) + "</tr>"
        for row in df.to_dict("records")
    )
    calibrations = "".join(
        f"<li><b>{html.escape(h)}</b>: {html.escape(c)}</li>"
        for h, c in dict(zip(df.hardware, df.calibration, strict=True)).items()
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;max-width:1200px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:right}}th{{background:#f4f4f4}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>Every figure is <b>simulated</b>: the simulated engine's step model on each hardware's profile,
run through a capacity search on the virtual clock. The band is the largest median leave-one-out
error of the calibration it rests on (throughput, interactivity, TTFT on published points the fit did not see).</p>
<img alt="agents per GPU and per MW by hardware and tier" src="data:image/png;base64,{image}" style="max-width:100%">
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
<h2>What each hardware's figures rest on</h2><ul>{calibrations}</ul>
</body></html>
"""
