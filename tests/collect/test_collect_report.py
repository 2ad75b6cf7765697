"""Full collect on a synthetic sweep: plots, self-contained report.html rendered in headless Chromium,
summary.md, `agentsweep pareto` and `agentsweep compare`."""

from __future__ import annotations

import base64
import re
import shutil
import struct
import subprocess

import pandas as pd
import pytest
from agentsweep.cli import main

pytestmark = pytest.mark.slow

CHECK_SCRIPT = """<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0 && i.naturalHeight > 0; });
  document.body.setAttribute("data-images", imgs.length + "/" + ok.length);
});
</script>"""


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    """One collect run shared by the tests below (plots take a few seconds)."""
    import importlib.util
    import sys
    from pathlib import Path

    # Reuse the factory module (conftest) to build the sweep once for the module.
    spec = importlib.util.spec_from_file_location("collect_conftest", Path(__file__).with_name("conftest.py"))
    factory = importlib.util.module_from_spec(spec)
    sys.modules["collect_conftest"] = factory
    spec.loader.exec_module(factory)
    root = tmp_path_factory.mktemp("sweep") / "artifacts"
    for s in factory.GRID:
        failed = s.tp == 2 and s.users == 32 and s.offload == "noprefix"
        factory.write_cell(
            root, s, status="FAILED" if failed else "SUCCESS", reason="engine OOM" if failed else None
        )
    out = root.parent / "aggregated"
    rc = main(["collect", str(root), str(out)])
    return rc, out, factory


def test_outputs_written(collected):
    rc, out, _ = collected
    assert rc == 1  # one FAILED cell
    for name in (
        "summary.csv",
        "frontier.csv",
        "report.html",
        "summary.md",
        "cache.png",
        "hit_rates.png",
        "pareto.png",
        "pareto_output_tok_per_s_per_gpu.png",
        "pareto_total_tok_per_s_per_gpu.png",
        "pareto_input_tok_per_s_per_gpu.png",
    ):
        assert (out / name).stat().st_size > 0, name
    width, height = _png_size((out / "pareto_output_tok_per_s_per_gpu.png").read_bytes())
    assert width >= 2000 and height >= 1000
    frontier = pd.read_csv(out / "frontier.csv")
    assert set(frontier["series_kind"]) == {"engine_offload", "engine_offload_tp", "pooled"}
    assert "demo-tp2-ep1-u32-noprefix" not in set(frontier["exp_name"])
    md = (out / "summary.md").read_text()
    assert "demo-tp2-ep1-u32-noprefix** (FAILED): engine OOM" in md
    assert "| Offload modes | noprefix, off, on |" in md


def test_report_is_self_contained(collected):
    _, out, _ = collected
    html = (out / "report.html").read_text()
    sources = re.findall(r'<img src="([^"]+)"', html)
    assert len(sources) == 6  # the main Pareto figure, three Pareto panels, cache, hit rates
    for src in sources:
        assert src.startswith("data:image/png;base64,")
        _png_size(base64.b64decode(src.split(",", 1)[1]))
    assert "http://" not in html and "https://" not in html
    assert "engine OOM" in html and "Qwen/Qwen3-32B" in html and "Ideal vs measured" in html


def test_no_plots_keeps_the_report_and_its_tables_without_figures(collected, tmp_path):
    """--no-plots into a folder an earlier collect drew: the same tables, a report that says it has no
    figures, and none of the earlier figures left beside them."""
    _, out, _ = collected
    again = tmp_path / "aggregated"
    shutil.copytree(out, again)
    assert main(["collect", str(out.parent / "artifacts"), str(again), "--no-plots"]) == 1  # one FAILED
    assert sorted(p.name for p in again.iterdir()) == sorted(
        ["capacity.csv", "frontier.csv", "report.html", "summary.csv", "summary.md"]
    )
    for name in ("summary.csv", "frontier.csv", "capacity.csv", "summary.md"):
        assert (again / name).read_text() == (out / name).read_text(), name
    html = (again / "report.html").read_text()
    assert "<img" not in html and 'id="no-figures"' in html and "--no-plots" in html
    drawn = (out / "report.html").read_text()
    assert 'id="no-figures"' not in drawn
    # Every table of the drawn report is in the one without figures.
    assert re.findall(r"<table[^>]*>", html) == re.findall(r"<table[^>]*>", drawn)
    assert "engine OOM" in html and "Ideal vs measured" in html


@pytest.mark.chromium
def test_report_renders_every_image_in_headless_chromium(collected, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip(
            "chromium not installed (apt-get install chromium; CI installs it from .ci/apt-packages.txt)"
        )
    _, out, _ = collected
    page = tmp_path / "check.html"
    page.write_text((out / "report.html").read_text().replace("</body>", CHECK_SCRIPT + "</body>"))
    flags = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ]
    dom = subprocess.run(
        [*flags, "--virtual-time-budget=10000", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-images="6/6"' in dom.stdout
    shot = tmp_path / "report.png"
    subprocess.run(
        [*flags, "--window-size=1400,3000", f"--screenshot={shot}", (out / "report.html").as_uri()],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert _png_size(shot.read_bytes()) == (1400, 3000)
    assert shot.stat().st_size > 50_000  # a blank page compresses to a few kB


def test_pareto_cli_from_summary(collected, tmp_path):
    _, out, _ = collected
    assert main(["pareto", str(out / "summary.csv"), str(tmp_path), "--no-plots"]) == 0
    assert pd.read_csv(tmp_path / "frontier.csv").equals(pd.read_csv(out / "frontier.csv"))
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    assert main(["pareto", str(tmp_path / "bad.csv"), str(tmp_path)]) == 2


def test_compare_ratios_per_matched_cell(collected, tmp_path, capsys):
    _, out, _ = collected
    a = pd.read_csv(out / "summary.csv")
    b = a.copy()
    b["output_tok_per_s_per_gpu"] *= 1.5
    b["ttft_p50_s"] *= 0.5
    b = b[b["users"] != 2]  # B lacks the u2 cells
    (tmp_path / "b").mkdir()
    b.to_csv(tmp_path / "b" / "summary.csv", index=False)
    assert main(["compare", str(out), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")]) == 0
    table = pd.read_csv(tmp_path / "cmp" / "compare.csv")
    matched = table[table["matched"]]
    assert len(matched) == len(b)
    assert matched["output_tok_per_s_per_gpu_ratio"].dropna().round(9).eq(1.5).all()
    assert matched["ttft_p50_s_ratio"].dropna().round(9).eq(0.5).all()
    assert (~table["matched"]).sum() == (a["users"] == 2).sum()
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| 1 | 1 | 2 | on | SUCCESS | absent |" in md
    assert "compare.csv" in capsys.readouterr().err
