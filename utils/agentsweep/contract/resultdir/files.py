"""Every file a cell result directory may hold: its name, what it means, who reads and writes it, and
the most a reader takes of it (ARCHITECTURE.md §3).

A part that adds a file to the result directory declares it here first, with its owner: the one
module that writes and reads it. Nothing else opens a result file by name.
"""

from __future__ import annotations

from dataclasses import dataclass

from kv_cache_tester.replay.results import (
    RECORD_LINE_MAX_BYTES,
    REQUESTS_FILE,
    SUMMARY_FILE,
    SUMMARY_MAX_BYTES,
)

CELL_JSON = "cell.json"
STATUS_TXT = "status.txt"
REQUESTS_JSONL = REQUESTS_FILE
SUMMARY_JSON = SUMMARY_FILE
SERVER_METRICS_CSV = "server_metrics.csv"
PREFILL_METRICS_CSV = "server_metrics.prefill.csv"
ROUTER_JSON = "router.json"
ROUTER_METRICS_CSV = "router_metrics.csv"
ROUTER_METRICS_TXT = "router_metrics.txt"
SERVER_LOG = "server.log"
POWER_CSV = "power.csv"
CAPACITY_JSON = "capacity.json"
STEPS_DIR = "steps"
RECEIPT_JSON = "receipt.json"
CLIENTS_DIR = "clients"
ACCURACY_JSON = "accuracy.json"
ACCURACY_JSONL = "accuracy.jsonl"

# The most a reader takes of each file it reads whole: past it the file is not one (a link to an
# endless device, say) and reads as broken. Streamed files (requests.jsonl, the CSVs) have no
# limit; they are read a line or a row at a time.
CELL_JSON_MAX_BYTES = 16 << 20
STATUS_TXT_MAX_BYTES = 1 << 20
ROUTER_JSON_MAX_BYTES = 4 << 20
# accuracy.json: a score and a subset of at most a few thousand question indices.
ACCURACY_JSON_MAX_BYTES = 4 << 20
ROUTER_METRICS_TXT_MAX_BYTES = 1 << 20
CAPACITY_JSON_MAX_BYTES = 16 << 20
# A receipt lists thousands of files at most; past this it is not one.
RECEIPT_JSON_MAX_BYTES = 64 << 20
# `agentsweep matrix --json` output: not in a result directory, but read beside them by collect.
MATRIX_MAX_BYTES = 64 << 20


def instance_metrics_csv(instance: str) -> str:
    """The scrapes of one engine instance of a routed cell (``r0``, ``p0``, ``d1``...)."""
    return f"server_metrics.{instance}.csv"


def instance_log(instance: str) -> str:
    """The log of one engine instance of a routed cell other than the client-facing first one."""
    return f"server.{instance}.log"


@dataclass(frozen=True)
class ResultFile:
    """One file (or a family of files: ``<instance>`` stands for an engine instance's name)."""

    name: str
    meaning: str
    owner: str  # the module that writes and reads it
    max_bytes: int | None  # the most a reader takes whole; None: streamed or not read back
    when: str = "every cell"


RESULT_FILES: tuple[ResultFile, ...] = (
    ResultFile(
        CELL_JSON,
        "the matrix cell (secrets masked), the resolved engine and replay commands, versions, visible "
        "devices, start/end (UTC), the verdict and its reasons; scale-out cells add the plan",
        "agentsweep.contract.resultdir.record",
        CELL_JSON_MAX_BYTES,
    ),
    ResultFile(
        STATUS_TXT,
        "SUCCESS | INVALID | FAILED on the first line, one reason per following line; written last, "
        "so its presence means cell.json is complete",
        "agentsweep.contract.resultdir.status",
        STATUS_TXT_MAX_BYTES,
    ),
    ResultFile(
        REQUESTS_JSONL,
        "one RequestRecord per finished request, appended as it finishes (ARCHITECTURE.md §4)",
        "kv_cache_tester.replay.results",
        None,
        when=f"cells that replayed (a line is at most {RECORD_LINE_MAX_BYTES >> 20} MiB)",
    ),
    ResultFile(
        SUMMARY_JSON,
        "the replayer's Summary (ARCHITECTURE.md §5: the steady window's bounds and rule, every latency "
        "and interactivity figure of docs/metrics.md, the stability block) plus the cell's validity record",
        "kv_cache_tester.replay.results",
        SUMMARY_MAX_BYTES,
        when="cells that replayed",
    ),
    ResultFile(
        SERVER_METRICS_CSV,
        "one row per scrape of the engine's /metrics in the engine-neutral columns (ARCHITECTURE.md "
        "§6); in a routed cell the client-facing instances' rows merged",
        "agentsweep.metrics.scrapes",
        None,
    ),
    ResultFile(
        instance_metrics_csv("<instance>"),
        "one engine instance's scrapes",
        "agentsweep.metrics.scrapes",
        None,
        when="routed cells",
    ),
    ResultFile(
        PREFILL_METRICS_CSV,
        "the prefill instances' scrapes merged",
        "agentsweep.metrics.scrapes",
        None,
        when="disaggregated cells",
    ),
    ResultFile(
        "server_metrics.sources.json",
        "per column of server_metrics.csv, the metric it was read from or why it is absent",
        "agentsweep.metrics.scraper",
        None,
        when="single-engine cells",
    ),
    ResultFile(
        "server_metrics.<instance>.sources.json",
        "the same for one engine instance's scrapes",
        "agentsweep.metrics.scraper",
        None,
        when="routed cells",
    ),
    ResultFile(
        CAPACITY_JSON,
        "per SLO tier the boundary users, agents per GPU, tok/s/GPU at the boundary, the binding "
        "constraint and its value, the interval, the boundary type (cliffs with the KV working set "
        "against the pool) and the stop reason; the step history and the step budget",
        "agentsweep.contract.resultdir.capacity",
        CAPACITY_JSON_MAX_BYTES,
        when="capacity cells",
    ),
    ResultFile(
        f"{STEPS_DIR}/",
        "one complete result directory per search step (steps/<n>/: cell.json, status.txt, "
        "requests.jsonl, summary.json, server_metrics.csv, logs, its own receipt.json), each an ordinary "
        "cell at one user count; capacity.json lists them",
        "agentsweep.capacity.run writes them; agentsweep.contract.resultdir.capacity names them (step_dir)",
        None,
        when="capacity cells",
    ),
    ResultFile(
        ROUTER_JSON,
        "the router's program, policy and instances, its requests per instance and affinity figures",
        "agentsweep.contract.resultdir.router",
        ROUTER_JSON_MAX_BYTES,
        when="routed cells",
    ),
    ResultFile(
        ROUTER_METRICS_CSV,
        "one row per scrape of the router's /metrics: requests sent to each instance so far",
        "agentsweep.cell.routers.scrape writes it, agentsweep.metrics.scrapes reads it",
        None,
        when="routed cells",
    ),
    ResultFile(
        ROUTER_METRICS_TXT,
        "the router's last /metrics text, histograms left out, for people",
        "agentsweep.cell.replicas",
        ROUTER_METRICS_TXT_MAX_BYTES,
        when="routed cells",
    ),
    ResultFile(
        POWER_CSV,
        "one row per GPU per power sample of the cell's GPUs on every node (time, node, GPU, W, the "
        "energy counter in J where the GPU has one, °C, utilisation %, memory MiB), or one row per "
        "fault of the sampling source; read back only by the power summary",
        "agentsweep.energy.powercsv",
        None,
        when="cells whose runner names a power source (power_source other than none)",
    ),
    ResultFile(
        "power-sampler.log",
        "the power sampler's output",
        "agentsweep.cell.executor",
        None,
        when="cells with a power source",
    ),
    ResultFile(
        SERVER_LOG,
        "the (client-facing) engine's output, its tail kept; the KV pool size is read from it",
        "agentsweep.cell.engine_process",
        None,
    ),
    ResultFile(
        instance_log("<instance>"),
        "another engine instance's output, its tail kept",
        "agentsweep.cell.engine_process",
        None,
        when="routed cells",
    ),
    ResultFile(
        "router.log", "the router's output, its tail kept", "agentsweep.cell.replicas", None, "routed cells"
    ),
    ResultFile("replay.log", "the replayer's output", "agentsweep.cell.lifecycle", None),
    ResultFile(
        ACCURACY_JSON,
        "the accuracy gate's outcome: task, questions, score, its Wilson 95% interval, the threshold and "
        "where it comes from, or why the step could not run (docs/accuracy.md)",
        "agentsweep.contract.resultdir.accuracy",
        ACCURACY_JSON_MAX_BYTES,
        when="cells whose accuracy gate runs (a real engine, or accuracy: on)",
    ),
    ResultFile(
        ACCURACY_JSONL,
        "every question the gate scored: index, question, reference, the model's response, the "
        "extracted answer, right or wrong",
        "agentsweep.accuracy.harness",
        None,
        when="cells whose accuracy gate scored",
    ),
    ResultFile(
        ".verdict.reserve",
        "room held for cell.json and status.txt should the run fill the disk; removed before the cell "
        "ends (a cell still running, or one killed outright, may leave it)",
        "agentsweep.cell.space",
        None,
        when="while a cell runs",
    ),
    ResultFile(
        "metrics-collector.log",
        "the scraper's output",
        "agentsweep.cell.lifecycle",
        None,
        when="single-engine cells",
    ),
    ResultFile(
        "metrics-collector.<instance>.log",
        "one engine instance's scraper's output",
        "agentsweep.cell.replicas",
        None,
        when="routed cells",
    ),
    ResultFile(
        "router-metrics-collector.log",
        "the router scraper's output",
        "agentsweep.cell.replicas",
        None,
        when="routed cells",
    ),
    ResultFile(
        "ttft_throughput.png",
        "the replayer's plot of TTFT and throughput over the run",
        "kv_cache_tester.replay.plots",
        None,
        when="cells that replayed, with matplotlib, unless $AGENTSWEEP_REPLAY_PLOT is off",
    ),
    ResultFile(
        "debug_trace.jsonl",
        "every streamed chunk of every request",
        "kv_cache_tester.replay.recorder",
        None,
        when="the replayer's --debug",
    ),
    ResultFile(
        "aiperf/",
        "AIPerf's own exports (requests.jsonl and summary.json are made from them)",
        "agentsweep.experimental.aiperf.cell",
        None,
        when="cells of the aiperf client",
    ),
    ResultFile(
        "aiperf.log",
        "AIPerf's output",
        "agentsweep.experimental.aiperf.cell",
        None,
        when="cells of the aiperf client",
    ),
    ResultFile(
        f"{CLIENTS_DIR}/",
        "one folder per client process of a cell whose lanes run on several nodes (clients/<k>/: its "
        "requests.jsonl, summary.json, run_meta.json and replay.log); requests.jsonl and summary.json "
        "above are their merge",
        "kv_cache_tester.replay.merge",
        None,
        when="cells with client_nodes > 1",
    ),
    ResultFile(
        RECEIPT_JSON,
        "written last, over the finished directory: sha256 and size of every other file in it (every "
        "file declared here, sub-folders included), the recipe fingerprint, the replayer's version and "
        "the project's commit",
        "agentsweep.contract.receipt",
        RECEIPT_JSON_MAX_BYTES,
        when="every cell that reached its verdict",
    ),
    ResultFile(
        "flamegraphs/",
        "per-trace cache flamegraphs and their index.html, drawn from requests.jsonl on request",
        "agentsweep.experimental.flamegraphs",
        None,
        when="after `python -m agentsweep.experimental.flamegraphs RESULT_DIR`",
    ),
)


def result_file(name: str) -> ResultFile:
    """The declaration of ``name`` (an instance's file matches its ``<instance>`` family; a folder is
    named with or without its trailing ``/``, and a file inside a declared folder, ``aiperf/x.json``,
    is that folder's)."""
    for declared in RESULT_FILES:
        if declared.name.rstrip("/") == name.rstrip("/"):
            return declared
    folder, slash, rest = name.partition("/")
    if slash and rest:
        for declared in RESULT_FILES:
            if declared.name == f"{folder}/":
                return declared
    for declared in RESULT_FILES:
        head, sep, tail = declared.name.partition("<instance>")
        if sep and name.startswith(head) and name.endswith(tail) and len(name) > len(head) + len(tail):
            return declared
    raise KeyError(f"{name}: not a declared result file (agentsweep.contract.resultdir.files)")
