// agentsweep dashboard: the Pareto explorer, drill-down, run overlay, baseline-versus-head, history and
// capacity views.
// Reads window.AGENTSWEEP_INDEX (data/index.js); each point's drill-down comes from
// data/points/<id>.js through a <script> tag, which also works from file://.
// window.agentsweep exposes what the page has drawn (for people poking at it and for tests).
//
// First paint: plotly.js is 4.8 MB and takes a browser seconds to start, so the page does not wait
// for it. The Pareto chart is first drawn as plain SVG (every point, the frontiers, axes and legend;
// a point's name on hover; a click opens its drill-down once Plotly is there), then plotly.js is
// loaded and the same chart is drawn again by Plotly, interactive (zoom, hover, the other views).
// timings.first_paint: the SVG chart on screen; timings.first_draw: the Plotly chart on screen
// (body[data-ready='1']); both in ms since the page began to load.
"use strict";
(function () {
  const IDX = window.AGENTSWEEP_INDEX;
  const $ = (id) => document.getElementById(id);
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
    "#17becf", "#bcbd22", "#7f7f7f"];
  // One colour per offload mode and one marker per TP, as agentsweep.style defines them for the
  // report's PNGs too (handed over in the index).
  const STYLE = IDX.style;
  const RUN_DASHES = ["solid", "dash", "dot", "dashdot", "longdash", "longdashdot"];
  function offloadColor(offload) { return STYLE.offload_colors[offload] || STYLE.other_color; }
  function tpSymbol(tp) {
    const known = STYLE.tp_symbols[String(tp)];
    if (known) return known;
    const n = Number(tp);
    return Number.isInteger(n) && n > 0 ? STYLE.other_symbols[n % STYLE.other_symbols.length] : STYLE.other_symbols[0];
  }
  function label(metric) { return IDX.metric_labels[metric] || metric; }
  const CONFIG = { displaylogo: false, responsive: true };
  const runs = new Map(IDX.runs.map((r) => [r.id, r]));
  const xModes = new Map(IDX.x_modes.map((m) => [m.key, m]));
  const state = {
    y: IDX.y_metrics[0].key, x: "interactivity", p: "p90", invalid: false,
    runFilter: "latest", model: "", hardware: "", engine: "", xScale: "auto", headlineRun: "",
    overlay: new Set(), compareBase: "", compareHead: "", historyScope: 0, historyMetric: IDX.history_metrics[0], tab: "pareto",
  };
  const hook = (window.agentsweep = { drawn: 0, drill: null, timings: {}, started: performance.now() });
  const drillCache = new Map();
  let plotlyReady = null;
  // plotly.js, loaded once, after the first paint (index.html names the bundle without running it).
  function plotly() {
    if (plotlyReady === null) {
      plotlyReady = new Promise((done, fail) => {
        if (window.Plotly) { done(); return; }
        const s = document.createElement("script");
        s.src = $("plotly-bundle").getAttribute("src");
        s.onload = () => { hook.timings.plotly_loaded = performance.now(); done(); };
        s.onerror = () => fail(new Error(`could not load ${s.src}`));
        document.head.appendChild(s);
      });
    }
    return plotlyReady;
  }

  // --- helpers ------------------------------------------------------------------------------
  function option(select, value, label, selected) {
    const o = document.createElement("option");
    o.value = value;
    o.textContent = label;
    if (selected) o.selected = true;
    select.appendChild(o);
  }
  function runOrder(run) { return [run.started || "", run.id]; }
  function newer(a, b) {
    const ka = runOrder(a), kb = runOrder(b);
    return ka[0] > kb[0] || (ka[0] === kb[0] && ka[1] > kb[1]);
  }
  function runLabel(id) { const r = runs.get(id); return `run ${id} (${r ? r.label : "?"})`; }
  function xMetric() { return xModes.get(state.x).template.replace("{p}", state.p); }
  function fmt(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "number") return Math.abs(v) >= 1000 ? v.toFixed(0) : v.toPrecision(4);
    return String(v);
  }

  // --- the one rendering layer -------------------------------------------------------------------
  // Everything in AGENTSWEEP_INDEX and a point's drill-down was read from result directories that
  // anyone can prepare: it is text, never markup. Markup reaches the page only through html`...`,
  // which escapes every value it is given unless that value is itself html`...` (or a list of
  // them), and through setHTML, which takes nothing else. Plotly draws a subset of HTML in trace
  // names, hover text and tick labels, so a value bound for Plotly goes through plotText.
  const ENTITIES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&#34;", "'": "&#39;" };
  function escapeText(v) { return String(v === null || v === undefined ? "" : v).replace(/[&<>"']/g, (c) => ENTITIES[c]); }
  class Markup { constructor(text) { this.text = text; } }
  function renderValue(v) {
    if (v instanceof Markup) return v.text;
    if (Array.isArray(v)) return v.map(renderValue).join("");
    return escapeText(v);
  }
  function html(strings, ...values) {
    let out = strings[0];
    values.forEach((v, i) => { out += renderValue(v) + strings[i + 1]; });
    return new Markup(out);
  }
  function setHTML(element, markup) {
    if (!(markup instanceof Markup)) throw new TypeError("setHTML takes html`...` markup only");
    element.innerHTML = markup.text;
  }
  const plotText = escapeText;
  // Resolves once the browser has painted what was drawn (two animation frames later).
  function painted() { return new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done))); }

  // --- which points ---------------------------------------------------------------------------
  // The same measurement in another run: everything but the versions (store.scope.identity).
  const IDENTITY_FIELDS = ["model", "hardware", "engine", "precision", "offload", "router", "shape",
    "config_key", "tp", "ep", "users", "gpus"];
  function identityKey(p) { return IDENTITY_FIELDS.map((k) => String(p[k] === undefined ? "" : p[k])).join("\u0001"); }
  // The newest measurement of each point: a rerun of some points hides only their older measurements,
  // never the points it did not rerun.
  function newestOfEach() {
    const newest = new Map();
    for (const p of IDX.points) {
      const key = identityKey(p), have = newest.get(key);
      if (have === undefined || newer(runs.get(p.run), runs.get(have.run))) newest.set(key, p);
    }
    return new Set([...newest.values()].map((p) => p.id));
  }
  // The points the Pareto view takes, and why each other point is left out (counted, and said).
  function paretoSelection() {
    const keep = state.runFilter === "latest" ? newestOfEach() : null;
    const hidden = { older: 0, run: 0, filter: 0 };
    const points = [];
    for (const p of IDX.points) {
      if (keep ? !keep.has(p.id) : state.runFilter !== "all" && String(p.run) !== state.runFilter) {
        hidden[keep ? "older" : "run"] += 1;
      } else if ((state.model && p.model !== state.model) || (state.hardware && p.hardware !== state.hardware) ||
          (state.engine && p.engine !== state.engine)) {
        hidden.filter += 1;
      } else {
        points.push(p);
      }
    }
    return { points, hidden };
  }
  function paretoPoints() { return paretoSelection().points; }
  // A series' name: what varies among the points, the offload mode, and a router or scale-out
  // shape only where there is one (one engine, one replica says nothing).
  function seriesLabel(p, varying) {
    const parts = varying.map((k) => p[k]).filter((v) => v);
    parts.push(`offload ${p.offload}`);
    if (p.router) parts.push(`router ${p.router}`);
    if (p.shape && p.shape !== "r1") parts.push(p.shape);
    return parts.join(" · ");
  }
  function routed(p) { return Boolean(p.router) || Boolean(p.shape && p.shape !== "r1"); }
  function varyingFields(points) {
    return ["model", "hardware", "engine", "engine_version", "precision"].filter(
      (k) => new Set(points.map((p) => p[k])).size > 1);
  }
  function frontier(points, xKey, higherBetter) {
    const sorted = points.slice().sort((a, b) => higherBetter ? b.m[xKey] - a.m[xKey] : a.m[xKey] - b.m[xKey]);
    const out = [];
    let best = -Infinity;
    for (const p of sorted) {
      if (p.m[state.y] > best) { out.push(p); best = p.m[state.y]; }
    }
    return out.sort((a, b) => a.m[xKey] - b.m[xKey]);
  }

  // --- traces ---------------------------------------------------------------------------------
  // groupOf(p) -> [series name, offload colour's point, dash]; every series takes its offload mode's
  // colour (a routed series one of its own), every point its TP's marker.
  // labelled: each frontier point named by its TP and users (the overlay, where runs share a chart).
  function pointTraces(points, groupOf, withFrontier, labelled) {
    const xKey = xMetric(), mode = xModes.get(state.x);
    const plotted = [], missing = [];
    for (const p of points) {
      if (p.status !== "SUCCESS" && !(state.invalid && p.status === "INVALID")) continue;
      if (p.m[xKey] === undefined || p.m[state.y] === undefined) missing.push(p); else plotted.push(p);
    }
    const groups = new Map();
    for (const p of plotted.filter((q) => q.status === "SUCCESS")) {
      const g = groupOf(p);
      if (!groups.has(g.name)) groups.set(g.name, { style: g, members: [] });
      groups.get(g.name).members.push(p);
    }
    const traces = [];
    let routedIndex = 0;
    for (const [name, { style, members }] of [...groups.entries()].sort()) {
      const color = style.routed ? STYLE.routed_colors[routedIndex++ % STYLE.routed_colors.length] : offloadColor(style.offload);
      traces.push(markerTrace(members, name, color, xKey));
      if (withFrontier && members.length > 1) {
        const f = frontier(members, xKey, mode.higher_better);
        const line = {
          x: f.map((p) => p.m[xKey]), y: f.map((p) => p.m[state.y]), mode: "lines", type: "scatter",
          line: { color, width: 1.5, dash: style.dash || "solid" }, legendgroup: plotText(name), showlegend: false,
          hoverinfo: "skip",
        };
        if (labelled) {
          Object.assign(line, { mode: "lines+text", text: f.map((p) => plotText(`TP${p.tp} u${p.users}`)),
            textposition: "top center", textfont: { size: 10, color } });
        }
        traces.push(line);
      }
    }
    const invalid = plotted.filter((p) => p.status === "INVALID");
    if (invalid.length) {
      const t = markerTrace(invalid, "INVALID", STYLE.invalid_color, xKey);
      t.marker.symbol = "x";
      traces.push(t);
    }
    return { traces, missing, plotted };
  }
  // Where a tail dominates (the largest value over 20 times the smallest), the x axis is logarithmic
  // unless the reader picked a scale.
  function xAxisType(traces) {
    if (state.xScale !== "auto") return state.xScale;
    const xs = traces.filter((t) => t.mode === "markers").flatMap((t) => t.x).filter((v) => v > 0);
    return xs.length && Math.max(...xs) / Math.min(...xs) > 20 ? "log" : "linear";
  }
  function markerTrace(points, name, color, xKey) {
    const lines = points.map((p) => [p.exp_name, `TP ${p.tp} · ${p.users} users · offload ${p.offload}`,
      `${runLabel(p.run)} · ${p.status}`]
      .concat(p.status === "INVALID" ? [String(p.reason || "").slice(0, 120)] : []));
    // Every hover names its figures and their units: the axes' metrics, then the other one.
    const other = state.y === "total_tok_per_s_per_gpu" ? "output_tok_per_s_per_gpu" : "total_tok_per_s_per_gpu";
    const trace = {
      x: points.map((p) => p.m[xKey]), y: points.map((p) => p.m[state.y]),
      customdata: points.map((p) => p.id),
      text: lines.map((l, i) => l.map(plotText).join("<br>") + "<br>" +
        plotText(`${label(other)}: ${fmt(points[i].m[other])}`)),
      hovertemplate: "%{text}<br>" + plotText(label(xKey)) + ": %{x:.4g}<br>" + plotText(label(state.y)) +
        ": %{y:.4g}<extra></extra>",
      mode: "markers", type: "scatter", name: plotText(name), legendgroup: plotText(name),
      marker: { color, size: 10, symbol: points.map((p) => tpSymbol(p.tp)), line: { width: 1, color: "#333" } },
    };
    // The unescaped name and hover lines, for the SVG preview (which escapes them itself); not
    // enumerable, so Plotly never sees them.
    Object.defineProperty(trace, "raw", { value: { name, lines } });
    return trace;
  }
  function axesLayout(title, traces) {
    return {
      title: { text: title, font: { size: 14 } },
      xaxis: { title: { text: plotText(label(xMetric())) }, zeroline: false, type: xAxisType(traces || []) },
      yaxis: { title: { text: plotText(label(state.y)) }, rangemode: "tozero" },
      hovermode: "closest", margin: { t: 40, r: 10 }, legend: { orientation: "h", y: -0.2 },
    };
  }
  // Marker per TP, said once under the chart (the legend's entries are the series).
  function markerNote(points) {
    const tps = [...new Set(points.map((p) => p.tp))].sort((a, b) => a - b);
    return tps.map((tp) => `TP ${tp}: ${tpSymbol(tp)}`).join(", ");
  }
  function missingNote(missing) {
    return missing.length ? `${missing.length} point(s) have no value for ${xMetric()} or ${state.y}; not drawn.` : "";
  }

  // --- Headline: each run's answer (collect.headline, computed when the dashboard was built) --------
  function drawHeadline() {
    const box = $("headline-body");
    const head = IDX.headlines[state.headlineRun];
    if (!head) { setHTML(box, html`<p class="note">No run in this store yet.</p>`); return; }
    setHTML(box, html`${head.groups.map((g) => html`<div class="group">
      <h2>${g.title}</h2><p class="verdicts">${g.verdicts}</p>
      ${g.note ? html`<p class="note">${g.note}</p>` : html``}
      ${g.tiers.length ? html`<table class="answer tiers"><tr><th>SLO tier</th><th>agents per GPU</th>
        <th>agents per MW</th><th>best configuration</th><th>bound by</th><th>how it was read</th></tr>
        ${g.tiers.map((t) => t.met ? html`<tr><td>${t.description}</td><td class="big">${t.agents}</td>
          <td>${t.per_mw}</td><td>${t.configuration}${t.ties ? ` (and ${t.ties} more with as many)` : ""}</td>
          <td>${t.binding}</td><td class="how">${t.reading}</td></tr>`
        : html`<tr class="unmet"><td>${t.description}</td><td class="big">none</td><td>-</td>
          <td>no configuration meets it</td><td colspan="2">${t.binding}</td></tr>`)}</table>` : html``}
      <table class="answer levels"><tr><th>interactivity</th><th>output tok/s per GPU</th>
        <th>total tok/s per GPU</th><th>configuration</th><th>how</th></tr>
        ${g.levels.map((l) => html`<tr class="level-${l.kind.replace(/ /g, "-")}"><td>${l.level_text}</td>
          <td class="big">${l.output === null ? "-" : l.output.toFixed(1)}</td>
          <td>${l.total === null ? "-" : Math.round(l.total).toLocaleString("en-US")}</td><td>${l.configuration || "-"}</td>
          <td class="how">${l.how}</td></tr>`)}</table></div>`)}
      <p class="note">Throughput per GPU on the Pareto frontier of the run's SUCCESS points at each level of
        ${head.interactivity}: interpolated between frontier points where marked, never extrapolated. Tiers:
        the run's capacity searches, and its series read as grids against the default tiers.</p>`);
  }

  // --- Pareto ---------------------------------------------------------------------------------
  async function drawPareto() {
    const { points, hidden } = paretoSelection();
    const varying = varyingFields(points);
    const { traces, missing, plotted } = pointTraces(points, (p) => seriesOf(p, varying), true);
    const gd = $("pareto");
    await plotly();
    const preview = gd.querySelector(".preview");
    if (preview) preview.remove();
    await Plotly.react(gd, traces, axesLayout("Throughput per GPU against interactivity / latency", traces), CONFIG);
    if (!gd.dataset.bound) {
      gd.on("plotly_click", (ev) => { if (ev.points.length) openDrill(ev.points[0].customdata); });
      gd.dataset.bound = "1";
    }
    $("pareto-note").textContent = paretoNote(points, plotted, missing, hidden);
    hook.drawn += 1;
  }

  function seriesOf(p, varying) {
    return { name: seriesLabel(p, varying), offload: p.offload, routed: routed(p) };
  }
  // What the view shows and what it leaves out, every point counted once.
  function paretoNote(points, plotted, missing, hidden) {
    const other = points.filter((p) => p.status !== "SUCCESS" && p.status !== "INVALID").length;
    const invalid = state.invalid ? 0 : points.filter((p) => p.status === "INVALID").length;
    const parts = [`${plotted.length} of ${IDX.points.length} point(s) shown.`];
    const left = [];
    if (hidden.older) left.push(`${hidden.older} older measurement(s) of points measured again later (runs: pick "every run" or a run to see them)`);
    if (hidden.run) left.push(`${hidden.run} point(s) of other runs`);
    if (hidden.filter) left.push(`${hidden.filter} point(s) outside the model / hardware / engine filters`);
    if (invalid) left.push(`${invalid} INVALID point(s) (tick the box to show them as grey crosses)`);
    if (other) left.push(`${other} FAILED, MALFORMED or capacity-cell point(s) (no figures to plot)`);
    if (missing.length) left.push(`${missing.length} point(s) without a value for ${label(xMetric())} or ${label(state.y)}`);
    parts.push(left.length ? `Hidden: ${left.join("; ")}.` : "Nothing hidden.");
    if (plotted.length) parts.push(`Markers: ${markerNote(plotted)}.`);
    return parts.join(" ");
  }

  // --- Overlay --------------------------------------------------------------------------------
  async function drawOverlay() {
    const points = IDX.points.filter((p) => state.overlay.has(p.run));
    const order = [...state.overlay].sort((a, b) => a - b);
    const varying = varyingFields(points);
    // Each run's own series and frontiers: the offload mode's colour, one line dash per run.
    const { traces, missing } = pointTraces(points, (p) => ({ ...seriesOf(p, varying),
      name: `run ${p.run} · ${seriesLabel(p, varying)}`, dash: RUN_DASHES[order.indexOf(p.run) % RUN_DASHES.length] }), true, true);
    await plotly();
    await Plotly.react($("overlay"), traces, axesLayout("Runs overlaid: each run's frontiers (line dash per run; " +
      "frontier points named TP and users)", traces), CONFIG);
    const gd = $("overlay");
    if (!gd.dataset.bound) {
      gd.on("plotly_click", (ev) => { if (ev.points.length) openDrill(ev.points[0].customdata); });
      gd.dataset.bound = "1";
    }
    $("overlay-note").textContent = state.overlay.size < 2 ? "Tick two or more runs to overlay them. " +
      missingNote(missing) : missingNote(missing);
    hook.drawn += 1;
  }

  // --- Baseline versus head -------------------------------------------------------------------------
  // Each run's headline carries, per hardware · model, output tok/s per GPU off its frontier at the
  // stated interactivity levels, with the figure's noise range where the store has one (± 2 standard
  // errors over the window's sub-windows, read off the frontier as the figure is). A change is judged
  // as `results diff` judges one (store.query.judge): beyond noise when the two ranges do not overlap,
  // with one range only when the other value lies outside it, and not judged without either.
  function beyondNoise(b, h, rb, rh) {
    if (rb && rh) return rh[0] > rb[1] || rh[1] < rb[0];
    if (rb) return h < rb[0] || h > rb[1];
    if (rh) return b < rh[0] || b > rh[1];
    return null;
  }
  function compareRows(baseId, headId) {
    const base = IDX.headlines[baseId], head = IDX.headlines[headId];
    const rows = [];
    if (!base || !head) return rows;
    const titles = [...head.groups.map((g) => g.title)];
    for (const g of base.groups) if (!titles.includes(g.title)) titles.push(g.title);
    for (const title of titles) {
      const bg = base.groups.find((g) => g.title === title), hg = head.groups.find((g) => g.title === title);
      if (!bg || !hg) {
        rows.push({ group: title, level: null, verdict: bg ? "only in the baseline" : "only in the head" });
        continue;
      }
      for (const hl of hg.levels) {
        const bl = bg.levels.find((l) => l.level === hl.level);
        const row = { group: title, level: hl.level, level_text: hl.level_text, base: bl || null, head: hl,
          change: null, flagged: null, verdict: "" };
        const baseLacks = !bl || bl.output === null, headLacks = hl.output === null;
        if (baseLacks && headLacks) {
          row.verdict = "not compared: neither run has a figure at this level";
        } else if (baseLacks || headLacks) {
          const missing = baseLacks ? ["baseline", bl] : ["head", hl];
          row.verdict = `not compared: the ${missing[0]} has no figure (${missing[1] ? missing[1].how : "no level"})`;
        } else {
          row.change = bl.output ? (hl.output - bl.output) / Math.abs(bl.output) : null;
          row.flagged = beyondNoise(bl.output, hl.output, bl.output_range, hl.output_range);
          row.verdict = row.flagged === null ? "not judged: no noise figure"
            : row.flagged ? (hl.output > bl.output ? "better beyond noise" : "worse beyond noise") : "within noise";
        }
        rows.push(row);
      }
    }
    return rows;
  }
  function rangeText(level) {
    return level && level.output_range ? `${fmt(level.output_range[0])}..${fmt(level.output_range[1])}` : "-";
  }
  async function drawCompare() {
    const rows = compareRows(state.compareBase, state.compareHead);
    const figures = rows.filter((r) => r.change !== null);
    const groups = new Set(figures.map((r) => r.group));
    const category = (r) => (groups.size > 1 ? `${r.group} · ` : "") + r.level_text;
    const bar = (side, name, color) => {
      const levels = figures.map((r) => r[side]);
      return {
        type: "bar", name: plotText(name), marker: { color },
        x: figures.map((r) => plotText(category(r))), y: levels.map((l) => l.output),
        error_y: { type: "data", symmetric: false, color: "#333",
          array: levels.map((l) => (l.output_range ? l.output_range[1] - l.output : 0)),
          arrayminus: levels.map((l) => (l.output_range ? l.output - l.output_range[0] : 0)) },
        text: levels.map((l) => plotText(l.configuration)),
        hovertemplate: "%{x}<br>" + plotText(label("output_tok_per_s_per_gpu")) + ": %{y:.4g}<br>%{text}<extra>" +
          plotText(name) + "</extra>",
      };
    };
    const traces = figures.length ? [bar("base", runLabel(Number(state.compareBase)) + " (baseline)", "#9aa5b1"),
      bar("head", runLabel(Number(state.compareHead)) + " (head)", "#224b8b")] : [];
    await plotly();
    await Plotly.react($("compare"), traces, {
      title: { text: "Output tok/s per GPU at each interactivity level: baseline against head (whiskers: noise range)",
        font: { size: 14 } },
      barmode: "group", hovermode: "closest", margin: { t: 40, r: 10 }, legend: { orientation: "h", y: -0.2 },
      xaxis: { title: { text: "interactivity level (tok/s per user), by hardware · model" } },
      yaxis: { title: { text: plotText(label("output_tok_per_s_per_gpu")) }, rangemode: "tozero" },
    }, CONFIG);
    const head = html`<tr><th>hardware · model</th><th>interactivity</th><th>baseline output tok/s/GPU</th>
      <th>head output tok/s/GPU</th><th>change</th><th>verdict</th><th>noise ranges (baseline / head)</th></tr>`;
    const body = rows.map((r) => r.level === null ? html`<tr><td>${r.group}</td><td colspan="6">${r.verdict}</td></tr>`
      : html`<tr class="${r.flagged ? (r.verdict.startsWith("worse") ? "worse" : "better") : ""}">
        <td>${r.group}</td><td>${r.level_text}</td>
        <td>${r.base && r.base.output !== null ? `${fmt(r.base.output)} (${r.base.configuration}; ${r.base.kind})` : "-"}</td>
        <td>${r.head.output !== null ? `${fmt(r.head.output)} (${r.head.configuration}; ${r.head.kind})` : "-"}</td>
        <td>${r.change === null ? "-" : `${r.change >= 0 ? "+" : ""}${(100 * r.change).toFixed(1)} %`}</td>
        <td class="verdict">${r.verdict}</td><td>${rangeText(r.base)} / ${rangeText(r.head)}</td></tr>`);
    setHTML($("compare-table"), html`${head}${body}`);
    const worse = rows.filter((r) => r.verdict === "worse beyond noise").length;
    const better = rows.filter((r) => r.verdict === "better beyond noise").length;
    $("compare-note").textContent = state.compareBase === state.compareHead ? "Pick two different runs." :
      `${figures.length} level(s) compared: ${worse} worse and ${better} better beyond noise. Figures off each ` +
      `run's frontier of SUCCESS points, ${IDX.headlines[state.compareHead] ? IDX.headlines[state.compareHead].interactivity : ""}.`;
    hook.compare = rows;
    hook.drawn += 1;
  }
  function buildCompareControls() {
    const byAge = IDX.runs.slice().sort((a, b) => (newer(a, b) ? -1 : 1));
    for (const r of byAge) {
      option($("compare-base"), String(r.id), runLabel(r.id), false);
      option($("compare-head"), String(r.id), runLabel(r.id), false);
    }
    // Head: the newest run; baseline: the newest older run that measured a hardware · model the head did.
    const titles = (id) => new Set(((IDX.headlines[id] || {}).groups || []).map((g) => g.title));
    state.compareHead = byAge.length ? String(byAge[0].id) : "";
    const shared = byAge.slice(1).find((r) => [...titles(String(r.id))].some((t) => titles(state.compareHead).has(t)));
    state.compareBase = shared ? String(shared.id) : byAge.length > 1 ? String(byAge[1].id) : state.compareHead;
    $("compare-head").value = state.compareHead;
    $("compare-base").value = state.compareBase;
    $("compare-base").addEventListener("change", (e) => { state.compareBase = e.target.value; drawCompare(); });
    $("compare-head").addEventListener("change", (e) => { state.compareHead = e.target.value; drawCompare(); });
  }

  function buildOverlayControls() {
    const box = $("overlay-runs");
    const ordered = IDX.runs.slice().sort((a, b) => (newer(a, b) ? -1 : 1));
    ordered.slice(0, 2).forEach((r) => state.overlay.add(r.id));
    for (const r of ordered) {
      const label = document.createElement("label");
      const input = document.createElement("input");
      input.type = "checkbox";
      input.value = r.id;
      input.checked = state.overlay.has(r.id);
      input.addEventListener("change", () => {
        if (input.checked) state.overlay.add(r.id); else state.overlay.delete(r.id);
        drawOverlay();
      });
      label.appendChild(input);
      label.appendChild(document.createTextNode(` ${runLabel(r.id)} ${r.started || ""}`));
      box.appendChild(label);
    }
  }

  // --- History --------------------------------------------------------------------------------
  async function drawHistory() {
    const group = IDX.history[state.historyScope];
    const gd = $("history");
    const table = $("history-table");
    await plotly();
    if (!group) {
      await Plotly.react(gd, [], { title: { text: "No SUCCESS points in the store yet" } }, CONFIG);
      setHTML(table, html``);
      return;
    }
    const lines = group.metrics[state.historyMetric] || [];
    const traces = [], flaggedX = [], flaggedY = [], flaggedText = [];
    const rows = [html`<tr><th>point</th><th>run</th><th>date</th><th>engine</th><th>value</th><th>change</th>
      <th>flag</th><th>noise</th></tr>`];
    lines.forEach((line, i) => {
      traces.push({
        x: line.entries.map((e) => e.when), y: line.entries.map((e) => e.value), name: plotText(line.label),
        mode: "lines+markers", type: "scatter", line: { color: PALETTE[i % PALETTE.length] },
        text: line.entries.map((e) => plotText(`${runLabel(e.run)} · engine ${e.engine_version}`)),
        hovertemplate: "%{text}<br>" + plotText(label(state.historyMetric)) + ": %{y:.4g}<extra>" +
          plotText(line.label) + "</extra>",
      });
      for (const e of line.entries) {
        if (e.flag) { flaggedX.push(e.when); flaggedY.push(e.value); flaggedText.push(plotText(`${line.label}: ${e.direction}`)); }
        const flag = e.flag === null ? (e.noise ? "not judged" : "") : e.flag ? `CHANGED ${e.direction}` : "within noise";
        rows.push(html`<tr><td>${line.label}</td><td>${runLabel(e.run)}</td>
          <td>${e.when || ""}</td><td>${e.engine_version}</td><td>${fmt(e.value)}</td>
          <td>${e.change === null ? "" : (100 * e.change).toFixed(1) + " %"}</td>
          <td class="${e.flag ? "fail" : ""}">${flag}</td><td>${e.noise}</td></tr>`);
      }
    });
    if (flaggedX.length) {
      traces.push({ x: flaggedX, y: flaggedY, text: flaggedText, name: "flagged change", mode: "markers",
        type: "scatter", marker: { symbol: "x", size: 14, color: "#b00020" }, hovertemplate: "%{text}<extra></extra>" });
    }
    const dates = new Set(lines.flatMap((line) => line.entries.map((e) => e.when)));
    await Plotly.react(gd, traces, {
      title: { text: plotText(`${label(state.historyMetric)} over runs`), font: { size: 14 } },
      // One run date is a category, not a time axis of milliseconds.
      xaxis: { title: { text: "run date" }, type: dates.size > 1 ? "date" : "category" },
      yaxis: { title: { text: plotText(label(state.historyMetric)) } },
      margin: { t: 40 }, legend: { orientation: "h", y: -0.25 },
    }, CONFIG);
    setHTML(table, html`${rows}`);
    hook.drawn += 1;
  }

  // --- Capacity -------------------------------------------------------------------------------
  async function drawCapacity() {
    const box = $("capacity");
    if (!IDX.capacity.length) {
      setHTML(box, html`<p class='note'>No capacity results in this store: capacity cells write
        capacity.json (per SLO tier the boundary, agents per GPU and the binding constraint), and their
        points appear here once ingested.</p>`);
      return;
    }
    const tiers = (c) => (c.capacity && Array.isArray(c.capacity.tiers) ? c.capacity.tiers : []);
    const steps = (c) => (c.capacity && Array.isArray(c.capacity.steps) ? c.capacity.steps.slice() : [])
      .sort((a, b) => a.users - b.users || a.index - b.index);
    setHTML(box, html`${IDX.capacity.map((c) => html`<h3>${c.exp_name || String(c.point)}</h3>
      <table><tr><th>tier</th><th>agents per GPU</th><th>agents per MW</th><th>boundary (users)</th>
        <th>interval (users)</th><th>boundary type</th><th>bound by</th><th>stop reason</th></tr>
      ${tiers(c).map((t) => html`<tr><td>${t.description}</td><td>${fmt(t.agents_per_gpu)}</td>
        <td>${t.agents_per_mw === null || t.agents_per_mw === undefined ? "-" : Math.round(t.agents_per_mw).toLocaleString("en-US")}</td>
        <td>${t.boundary_users === null || t.boundary_users === undefined ? "-" : String(t.boundary_users)}</td>
        <td>${t.interval_users ? `${t.interval_users[0]}–${t.interval_users[1] === null ? "" : t.interval_users[1]}` : "-"}</td>
        <td>${t.boundary_type}</td><td>${t.binding || "-"}</td><td>${t.stop_reason}</td></tr>`)}</table>
      <p class="note">Steps in user order (${c.capacity && c.capacity.repeats > 1 ? `${c.capacity.repeats} runs per count` :
        "one run per count: a boundary's bracket is the search's resolution, not a measured spread"}):</p>
      <div class="capacity-plots" data-cell="${String(c.point)}"></div>
      <table><tr><th>users</th><th>run</th><th>step</th><th>verdict</th><th>output tok/s per GPU</th></tr>
      ${steps(c).map((s) => html`<tr><td>${s.users}</td><td>${(s.repeat || 0) + 1}</td><td>${s.index}</td>
        <td>${s.status}</td><td>${fmt(s.output_tok_per_s_per_gpu)}</td></tr>`)}</table>`)}`);
    // Per capacity cell, one small chart per statistic its steps measured (and output tok/s per GPU)
    // against users: SUCCESS steps as dots, the others as crosses, each tier's boundary a dashed line.
    await plotly();
    const draws = [];
    for (const c of IDX.capacity) {
      const holder = box.querySelector(`.capacity-plots[data-cell="${CSS.escape(String(c.point))}"]`);
      const measured = steps(c);
      const keys = [...new Set(measured.flatMap((s) => Object.keys(s.statistics || {})))];
      const charts = keys.map((k) => [IDX.statistic_labels[k] || k, (s) => (s.statistics || {})[k]]);
      charts.push([label("output_tok_per_s_per_gpu"), (s) => s.output_tok_per_s_per_gpu]);
      const bounds = tiers(c).filter((t) => t.boundary_users);
      for (const [title, value] of charts) {
        const div = document.createElement("div");
        div.className = "plot small";
        holder.appendChild(div);
        const kinds = [["SUCCESS", (s) => s.status === "SUCCESS", "circle"], ["not SUCCESS", (s) => s.status !== "SUCCESS", "x"]];
        const traces = kinds.map(([name, keep, symbol]) => {
          const pts = measured.filter((s) => keep(s) && value(s) !== null && value(s) !== undefined);
          return { x: pts.map((s) => s.users), y: pts.map(value), mode: "markers", type: "scatter", name,
            marker: { symbol, size: 9, color: symbol === "x" ? STYLE.invalid_color : "#224b8b" },
            text: pts.map((s) => plotText(`step ${s.index} · ${s.status}`)),
            hovertemplate: "%{x} users<br>" + plotText(title) + ": %{y:.4g}<br>%{text}<extra></extra>" };
        });
        const shapes = bounds.map((t) => ({ type: "line", xref: "x", yref: "paper", x0: t.boundary_users,
          x1: t.boundary_users, y0: 0, y1: 1, line: { dash: "dash", width: 1, color: "#666" } }));
        const annotations = bounds.map((t) => ({ x: t.boundary_users, y: 1, xref: "x", yref: "paper",
          text: plotText(`${t.tier}: ${t.boundary_users}`), showarrow: false, yanchor: "bottom", font: { size: 10 } }));
        draws.push(Plotly.react(div, traces, {
          title: { text: plotText(title), font: { size: 12 } }, margin: { t: 44, r: 10, l: 50, b: 40 },
          xaxis: { title: { text: "users" } }, yaxis: { rangemode: "tozero" }, showlegend: false,
          shapes, annotations, hovermode: "closest",
        }, CONFIG));
      }
    }
    await Promise.all(draws);
    hook.drawn += 1;
  }

  // --- Drill-down -----------------------------------------------------------------------------
  window.agentsweepOpen = (id) => openDrill(id);  // open a drill-down by point id (as a click does)
  window.agentsweepPoint = function (id, payload) {
    drillCache.set(id, payload);
    plotly().then(() => renderDrill(id, payload));
  };
  function openDrill(id) {
    hook.drillRequested = performance.now();
    const section = $("drilldown");
    section.hidden = false;
    section.dataset.drawn = "";
    section.dataset.point = id;
    $("drill-title").textContent = "loading…";
    if (drillCache.has(id)) { plotly().then(() => renderDrill(id, drillCache.get(id))); return; }
    const s = document.createElement("script");
    s.src = `data/points/${id}.js`;
    s.onerror = () => { $("drill-title").textContent = `no drill-down for point ${id}`; };
    document.body.appendChild(s);
  }
  function lanesTraces(r) {
    const seg = { ok: [[], []], err: [[], []], warm: [[], []] };
    const tx = [], ty = [];
    for (let i = 0; i < r.t.length; i++) {
      if (r.done[i] === null) continue;
      const lane = r.lane[i];
      const kind = r.flags[i] & 2 ? "warm" : r.flags[i] & 1 ? "ok" : "err";
      seg[kind][0].push(r.t[i], r.done[i], null);
      seg[kind][1].push(lane, lane, null);
      if (r.ttft[i] !== null) { tx.push(r.t[i] + r.ttft[i]); ty.push(lane); }
    }
    const line = (xy, name, color) => ({ x: xy[0], y: xy[1], name, mode: "lines", type: "scattergl",
      line: { color, width: 3 }, hoverinfo: "skip" });
    return [line(seg.ok, "request (ok)", "#7aa6d8"), line(seg.err, "request (error)", "#d62728"),
      line(seg.warm, "warmup", "#c7c7c7"),
      { x: tx, y: ty, name: "first token", mode: "markers", type: "scattergl",
        marker: { color: "#11335f", size: 4, symbol: "diamond" }, hovertemplate: "TTFT at %{x:.3f} s<extra></extra>" }];
  }
  // Past this many requests the three request charts are drawn onto a canvas and shown as an image
  // on Plotly's axes: tens of thousands of WebGL marks take seconds to paint in a software-rendered
  // browser, a canvas takes milliseconds. Zoom still works (the image stretches); hover per request
  // is left to smaller cells.
  const RASTER_ABOVE = 5000;
  function extent(values, pad) {
    let lo = Infinity, hi = -Infinity;
    for (const v of values) { if (v !== null && v === v) { if (v < lo) lo = v; if (v > hi) hi = v; } }
    if (lo === Infinity) return [0, 1];
    const span = hi - lo || Math.abs(hi) || 1;
    return [lo - span * pad, hi + span * pad];
  }
  // marks: [{x, y, x2 (segments) or none (dots), color, size, name}] drawn in order.
  function rasterTraces(div, layout, marks, xr, yr) {
    const gd = $(div);
    const width = Math.max(300, gd.clientWidth), height = Math.max(200, gd.clientHeight);
    const canvas = document.createElement("canvas");
    canvas.width = width;
    canvas.height = height;
    const ctx = canvas.getContext("2d");
    const sx = width / (xr[1] - xr[0]), sy = height / (yr[1] - yr[0]);
    for (const m of marks) {
      ctx.fillStyle = m.color;
      const half = m.size / 2;
      for (let i = 0; i < m.x.length; i++) {
        const x = m.x[i], y = m.y[i];
        if (x === null || y === null) continue;
        const px = (x - xr[0]) * sx, py = height - (y - yr[0]) * sy;
        if (m.x2) {
          const x2 = m.x2[i];
          if (x2 === null) continue;
          ctx.fillRect(px, py - half, Math.max(1, (x2 - x) * sx), m.size);
        } else {
          ctx.fillRect(px - half, py - half, m.size, m.size);
        }
      }
    }
    layout.xaxis.range = xr;
    layout.yaxis.range = yr;
    layout.images = [{ source: canvas.toDataURL("image/png"), xref: "x", yref: "y", x: xr[0], y: yr[1],
      sizex: xr[1] - xr[0], sizey: yr[1] - yr[0], sizing: "stretch", layer: "below" }];
    // Empty traces carry the legend and keep the axes.
    const traces = marks.map((m) => ({ x: [null], y: [null], name: m.name, mode: "markers", type: "scatter",
      marker: { color: m.color, size: 8, symbol: "square" } }));
    return Plotly.react(gd, traces, layout, CONFIG);
  }
  function drawRequests(d, base) {
    const r = d.requests;
    const okIdx = [...r.t.keys()].filter((i) => (r.flags[i] & 1) && !(r.flags[i] & 2));
    const timelineLayout = base("Requests per lane over time (diamond: first token; green: measurement window)",
      "lane (user)");
    const ttftLayout = base("TTFT by dispatch time", "TTFT (s)");
    const itlLayout = base("Mean inter-token latency by finish time", "ITL (s)");
    if (r.t.length <= RASTER_ABOVE) {
      return [
        Plotly.react($("drill-timeline"), lanesTraces(r), timelineLayout, CONFIG),
        Plotly.react($("drill-ttft"), [{ x: okIdx.map((i) => r.t[i]), y: okIdx.map((i) => r.ttft[i]),
          mode: "markers", type: "scattergl", name: "TTFT", marker: { size: 4, color: "#1f77b4" } }], ttftLayout, CONFIG),
        Plotly.react($("drill-itl"), [{ x: okIdx.map((i) => r.done[i]), y: okIdx.map((i) => r.itl[i]),
          mode: "markers", type: "scattergl", name: "mean ITL", marker: { size: 4, color: "#ff7f0e" } }], itlLayout, CONFIG),
      ];
    }
    const pick = (idx, values) => idx.map((i) => values[i]);
    const kinds = { ok: [], err: [], warm: [] };
    r.t.forEach((_, i) => kinds[r.flags[i] & 2 ? "warm" : r.flags[i] & 1 ? "ok" : "err"].push(i));
    const xr = extent([...r.t, ...r.done], 0.01);
    const lanes = extent(r.lane, 0);
    const firstToken = r.t.map((t, i) => (r.ttft[i] === null ? null : t + r.ttft[i]));
    const segments = (name, color, idx) => ({ name, color, size: 3, x: pick(idx, r.t), x2: pick(idx, r.done),
      y: pick(idx, r.lane) });
    const all = [...r.t.keys()];
    return [
      rasterTraces("drill-timeline", timelineLayout, [segments("request (ok)", "#7aa6d8", kinds.ok),
        segments("request (error)", "#d62728", kinds.err), segments("warmup", "#c7c7c7", kinds.warm),
        { name: "first token", color: "#11335f", size: 3, x: firstToken, y: pick(all, r.lane) }],
        xr, [lanes[0] - 0.5, lanes[1] + 0.5]),
      rasterTraces("drill-ttft", ttftLayout, [{ name: "TTFT", color: "#1f77b4", size: 3, x: pick(okIdx, r.t),
        y: pick(okIdx, r.ttft) }], extent(pick(okIdx, r.t), 0.01), [0, extent(pick(okIdx, r.ttft), 0.05)[1]]),
      rasterTraces("drill-itl", itlLayout, [{ name: "mean ITL", color: "#ff7f0e", size: 3, x: pick(okIdx, r.done),
        y: pick(okIdx, r.itl) }], extent(pick(okIdx, r.done), 0.01), [0, extent(pick(okIdx, r.itl), 0.05)[1]]),
    ];
  }
  function windowShape(w) {
    return w ? [{ type: "rect", xref: "x", yref: "paper", x0: w[0], x1: w[1], y0: 0, y1: 1,
      fillcolor: "#2ca02c", opacity: 0.06, line: { width: 0 } }] : [];
  }
  async function renderDrill(id, d) {
    const meta = IDX.points.find((p) => p.id === id);
    $("drill-title").textContent = `${d.exp_name} — ${d.status}`;
    const r = d.requests;
    const bits = [];
    if (meta) bits.push(`${runLabel(meta.run)} · ${meta.model} · ${meta.engine} ${meta.engine_version} · ${meta.hardware}`);
    if (d.reason) bits.push(`reason: ${d.reason}`);
    bits.push(`${r.total} requests` + (r.stride > 1 ? ` (every ${r.stride}th drawn)` : "") +
      (r.t.length > RASTER_ABOVE ? "; request charts drawn as images (hover per request below 5,000)" : ""));
    if (d.clock_scale !== 1) bits.push(`simulated engine at speed ${d.clock_scale}: times in the engine's clock`);
    if (d.notes && d.notes.length) bits.push(`notes: ${d.notes.join("; ")}`);
    $("drill-meta").textContent = bits.join(" · ");
    // The point's own figures (the ones on the chart and in the tables), each named with its unit.
    const figures = meta ? IDX.point_figures.filter((k) => meta.m[k] !== undefined) : [];
    setHTML($("drill-figures"), figures.length ? html`<tr><th>figure</th><th>value</th></tr>${figures.map((k) =>
      html`<tr><td>${label(k)}</td><td>${k.endsWith("hit_rate") || k === "kv_usage_peak" ?
        (100 * meta.m[k]).toFixed(1) + " %" : fmt(meta.m[k])}</td></tr>`)}` :
      html`<tr><td>no figures: the cell ran nothing to measure (a FAILED cell, or a capacity cell whose steps
        are points of their own)</td></tr>`);
    const shapes = windowShape(d.window);
    const base = (title, y) => ({ title: { text: title, font: { size: 13 } }, margin: { t: 36, r: 10 },
      xaxis: { title: { text: "s from run start" } }, yaxis: { title: { text: y } }, shapes,
      legend: { orientation: "h", y: -0.3 }, hovermode: "closest" });
    const draws = [];
    draws.push(...drawRequests(d, base));
    const kv = [];
    if (d.server) {
      const s = d.server;
      const add = (series, name, color, dash) => { if (series && series.t.length) kv.push({ x: series.t, y: series.v,
        name, mode: "lines", type: "scatter", line: { color, dash } }); };
      add(s.kv, "GPU KV usage", "#1f77b4"); add(s.cpu_kv, "CPU KV usage", "#9467bd");
      add(s.gpu_hit, "GPU hit rate", "#2ca02c", "dot"); add(s.cpu_hit, "CPU hit rate", "#8c564b", "dot");
    }
    const kvLayout = base(d.server ? "KV cache usage and hit rate (scraped metrics)" : "No scraped server metrics", "fraction");
    kvLayout.yaxis.range = [0, 1.05];
    draws.push(Plotly.react($("drill-kv"), kv, kvLayout, CONFIG));
    const rt = [];
    let routerTitle = "Not a routed cell: no per-instance requests";
    if (d.router && d.router.over_time) {
      routerTitle = "Requests the router sent each instance (cumulative)";
      for (const [name, counts] of Object.entries(d.router.over_time.instances)) {
        rt.push({ x: d.router.over_time.t, y: counts, name: plotText(name), mode: "lines", type: "scatter" });
      }
    } else if (d.router && d.router.totals) {
      routerTitle = "Requests the router sent each instance (run total)";
      for (const [key, counts] of Object.entries(d.router.totals)) {
        rt.push({ x: counts.map((_, i) => plotText(`${key.replace("requests_by_", "")} ${i}`)), y: counts,
          name: plotText(key), type: "bar" });
      }
    }
    const routerLayout = base(routerTitle, "requests");
    if (!(d.router && d.router.over_time)) { routerLayout.xaxis = {}; routerLayout.shapes = []; }
    // An unrouted cell has no router chart at all (not an empty one).
    $("drill-router").hidden = !d.router;
    if (d.router) draws.push(Plotly.react($("drill-router"), rt, routerLayout, CONFIG));
    const rows = [html`<tr><th>check</th><th>value</th><th>limit</th><th>result</th><th>reason</th></tr>`];
    for (const c of d.checks) {
      rows.push(html`<tr><td>${c.name}</td><td>${fmt(c.value)}</td><td>${fmt(c.limit)}</td>
        <td class="${c.ok ? "ok" : "fail"}">${c.ok ? "pass" : "FAIL"}</td><td>${c.reason || ""}</td></tr>`);
    }
    if (!d.checks.length) rows.push(html`<tr><td colspan=5>no checks recorded in summary.json</td></tr>`);
    setHTML($("drill-checks"), html`${rows}`);
    await Promise.all(draws);
    await painted();
    const section = $("drilldown");
    section.dataset.drawn = "1";
    hook.drill = id;
    hook.timings.drill = performance.now() - (hook.drillRequested || performance.now());
    section.scrollIntoView({ block: "start" });
  }

  // --- controls -------------------------------------------------------------------------------
  function redraw() {
    if (state.tab === "pareto") return drawPareto();
    if (state.tab === "overlay") return drawOverlay();
    if (state.tab === "compare") return drawCompare();
    if (state.tab === "history") return drawHistory();
    return drawCapacity();
  }
  function fillFilter(id, field, key) {
    const select = $(id);
    option(select, "", `all ${field}`, true);
    for (const v of [...new Set(IDX.points.map((p) => p[field]))].sort()) option(select, v, v, false);
    select.addEventListener("change", () => { state[key] = select.value; drawPareto(); });
  }
  function setup() {
    const byAge = IDX.runs.slice().sort((a, b) => (newer(a, b) ? -1 : 1));
    for (const r of byAge) option($("headline-run"), String(r.id), runLabel(r.id), false);
    state.headlineRun = byAge.length ? String(byAge[0].id) : "";
    $("headline-run").value = state.headlineRun;
    $("headline-run").addEventListener("change", (e) => { state.headlineRun = e.target.value; drawHeadline(); });
    for (const m of IDX.y_metrics) option($("y-metric"), m.key, m.label, m.key === state.y);
    for (const m of IDX.x_modes) option($("x-mode"), m.key, m.label, m.key === state.x);
    for (const p of IDX.percentiles) option($("percentile"), p.key, p.label, p.key === state.p);
    $("y-metric").addEventListener("change", (e) => { state.y = e.target.value; redraw(); });
    $("x-mode").addEventListener("change", (e) => { state.x = e.target.value; redraw(); });
    $("percentile").addEventListener("change", (e) => { state.p = e.target.value; redraw(); });
    $("show-invalid").addEventListener("change", (e) => { state.invalid = e.target.checked; redraw(); });
    for (const [v, l] of [["auto", "auto (log where a tail dominates)"], ["linear", "linear"], ["log", "log"]]) {
      option($("x-scale"), v, l, v === state.xScale);
    }
    $("x-scale").addEventListener("change", (e) => { state.xScale = e.target.value; redraw(); });
    option($("run-filter"), "latest", "newest measurement of each point", true);
    option($("run-filter"), "all", "every run", false);
    for (const r of IDX.runs.slice().reverse()) option($("run-filter"), String(r.id), runLabel(r.id), false);
    $("run-filter").addEventListener("change", (e) => { state.runFilter = e.target.value; drawPareto(); });
    fillFilter("model-filter", "model", "model");
    fillFilter("hardware-filter", "hardware", "hardware");
    fillFilter("engine-filter", "engine", "engine");
    IDX.history.forEach((g, i) => option($("history-scope"), String(i), g.scope, i === 0));
    for (const m of IDX.history_metrics) option($("history-metric"), m, label(m), m === state.historyMetric);
    $("history-scope").addEventListener("change", (e) => { state.historyScope = Number(e.target.value); drawHistory(); });
    $("history-metric").addEventListener("change", (e) => { state.historyMetric = e.target.value; drawHistory(); });
    buildOverlayControls();
    buildCompareControls();
    for (const b of document.querySelectorAll("#tabs button")) {
      b.addEventListener("click", () => {
        state.tab = b.dataset.tab;
        for (const other of document.querySelectorAll("#tabs button")) other.classList.toggle("active", other === b);
        for (const t of document.querySelectorAll(".tab")) t.hidden = t.id !== `tab-${state.tab}`;
        $("axes").hidden = ["history", "capacity", "compare"].includes(state.tab);
        $("drilldown").hidden = true;  // a point's drill-down belongs to the chart it was opened from
        redraw();
      });
    }
    $("drill-close").addEventListener("click", () => { $("drilldown").hidden = true; });
  }

  // --- first paint: the Pareto chart as SVG, before plotly.js -----------------------------------
  // About n round tick values covering [lo, hi] (steps of 1, 2 or 5 times a power of ten).
  function ticks(lo, hi, n) {
    const raw = (hi - lo) / n || 1;
    const mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((f) => f * mag).find((v) => v >= raw);
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }
  // The same traces drawPareto hands Plotly, as one SVG string (the HTML parser builds it at once).
  function drawPreview() {
    const points = paretoPoints();
    const { traces } = pointTraces(points, (p) => seriesOf(p, varyingFields(points)), true);
    const gd = $("pareto");
    const width = Math.max(400, gd.clientWidth), height = Math.max(300, gd.clientHeight);
    const series = traces.filter((t) => t.mode === "markers");
    const m = { l: 70, r: 10, t: 40, b: 60 + 18 * Math.ceil(series.length / 3) };
    const w = width - m.l - m.r, h = height - m.t - m.b;
    const xs = series.flatMap((t) => t.x), ys = series.flatMap((t) => t.y);
    const out = [html`<svg class="preview" width="${width}" height="${height}" font-size="11">`,
      html`<text x="${m.l}" y="24" font-size="14">Throughput per GPU against interactivity / latency</text>`];
    if (xs.length) {
      let x0 = Math.min(...xs), x1 = Math.max(...xs);
      const pad = (x1 - x0) * 0.05 || Math.abs(x1) * 0.1 || 1;
      x0 -= pad;
      x1 += pad;
      const y1 = Math.max(...ys) * 1.05 || 1;
      const px = (x) => (m.l + ((x - x0) / (x1 - x0)) * w).toFixed(1);
      const py = (y) => (m.t + h - (y / y1) * h).toFixed(1);
      for (const t of ticks(x0, x1, 6)) {
        out.push(html`<line x1="${px(t)}" x2="${px(t)}" y1="${m.t}" y2="${m.t + h}" stroke="#eee"/>`,
          html`<text x="${px(t)}" y="${m.t + h + 14}" text-anchor="middle" fill="#444">${fmt(t)}</text>`);
      }
      for (const t of ticks(0, y1, 6)) {
        out.push(html`<line x1="${m.l}" x2="${m.l + w}" y1="${py(t)}" y2="${py(t)}" stroke="#eee"/>`,
          html`<text x="${m.l - 6}" y="${+py(t) + 4}" text-anchor="end" fill="#444">${fmt(t)}</text>`);
      }
      out.push(html`<text x="${m.l + w / 2}" y="${m.t + h + 32}" text-anchor="middle" font-size="12">${
        label(xMetric())}</text>`,
        html`<text x="16" y="${m.t + h / 2}" text-anchor="middle" font-size="12"
          transform="rotate(-90 16 ${m.t + h / 2})">${label(state.y)}</text>`);
      for (const t of traces) {
        if (t.mode !== "lines") continue;
        const line = t.x.map((x, i) => `${px(x)},${py(t.y[i])}`).join(" ");
        out.push(html`<polyline points="${line}" fill="none" stroke="${t.line.color}" stroke-width="1.5"/>`);
      }
      series.forEach((t, k) => {
        const circles = t.x.map((x, i) => html`<circle cx="${px(x)}" cy="${py(t.y[i])}" r="4.5"
          data-point="${t.customdata[i]}"><title>${t.raw.lines[i].join(" · ")}</title></circle>`);
        const lx = m.l + (k % 3) * (w / 3), ly = m.t + h + 48 + 18 * Math.floor(k / 3);
        out.push(html`<g fill="${t.marker.color}" stroke="#333">${circles}</g>`,
          html`<rect x="${lx}" y="${ly - 9}" width="10" height="10" fill="${t.marker.color}"/>`,
          html`<text x="${lx + 14}" y="${ly}">${t.raw.name}</text>`);
      });
    }
    out.push(html`</svg>`);
    const holder = document.createElement("div");
    setHTML(holder, html`${out}`);
    gd.appendChild(holder.firstElementChild);
    hook.preview = { points: xs.length, series: series.map((t) => t.name) };
    gd.querySelector(".preview").addEventListener("click", (ev) => {
      const id = ev.target.dataset && ev.target.dataset.point;
      if (id) openDrill(Number(id));
    });
  }

  setup();
  drawHeadline();
  drawPreview();
  painted().then(() => {
    hook.timings.first_paint = performance.now();  // ms since the page began to load
    return drawPareto();
  }).then(painted).then(() => {
    hook.timings.first_draw = performance.now();
    document.body.dataset.ready = "1";
  });
})();
