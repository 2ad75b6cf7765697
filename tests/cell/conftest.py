"""Small real stand-in processes for the cell lifecycle tests (engine, scraper, replayer)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

STANDIN_ENGINE = textwrap.dedent(
    """
    import argparse, http.server, os, signal, sys, threading, time
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", default="healthy")  # healthy | never | crash-at-start | crash-after
    p.add_argument("--after", type=float, default=1.0)
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--child-pid-file")
    a = p.parse_args()
    print("standin engine starting", flush=True)
    if a.child_pid_file:  # a worker child in the same process group, like an engine's workers
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
        open(a.child_pid_file, "w").write(str(child.pid))
    if a.mode == "crash-at-start":
        time.sleep(0.3)
        print("RuntimeError: CUDA out of memory while loading weights", flush=True)
        print("  warnings.warn('resource_tracker: leaked semaphore')", flush=True)  # noise after the error
        sys.exit(3)
    if a.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                code = 503 if a.mode == "never" else 200
            elif self.path == "/version":
                code = 200
            else:
                code = 404
            body = b'{"version": "9.9.9-standin"}' if self.path == "/version" else b"ok"
            self.send_response(code); self.send_header("Content-Length", str(len(body))); self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", a.port), H)
    if a.mode == "crash-after":
        def crash():
            time.sleep(a.after)
            print("engine core died: segfault (standin)", flush=True)
            os._exit(7)
        threading.Thread(target=crash, daemon=True).start()
    srv.serve_forever()
    """
)

STANDIN_REPLAYER = textwrap.dedent(
    """
    import json, os, signal, sys, time
    out, seconds, exit_code = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    stop = False
    def on_term(*_):
        global stop
        stop = True
    signal.signal(signal.SIGTERM, on_term)
    n = 0
    t0, t0_unix = time.monotonic(), time.time()
    with open(os.path.join(out, "requests.jsonl"), "a") as fh:
        end = t0 + seconds
        while time.monotonic() < end and not stop:
            n += 1
            sent = time.monotonic() - t0
            time.sleep(0.05)
            record = {"trace_id": "t", "status": "ok", "turn": n, "user": n % 2, "phase": "profile",
                      "t_dispatch": sent, "t_done": time.monotonic() - t0, "ttft_s": 0.01, "output_tokens": 10}
            fh.write(json.dumps(record) + "\\n"); fh.flush()
    window = {"start_unix": t0_unix, "end_unix": time.time(), "duration_s": time.monotonic() - t0}
    audit = {"dispatch_lag_s": {"p99": 0.001}, "client_cpu_share": 0.01}
    with open(os.path.join(out, "summary.json"), "w") as fh:
        json.dump({"schema_version": 1, "counts": {"sent": n, "ok": n, "failed": 0}, "window": window,
                   "self_audit": audit}, fh)
    print(f"replayed {n} requests", flush=True)
    sys.exit(exit_code)
    """
)

# Writes server_metrics.csv rows whose finished-request counter follows requests.jsonl, like an engine's.
STANDIN_SCRAPER = textwrap.dedent(
    """
    import os, signal, sys, time
    out = sys.argv[1]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    columns = ["time_s", "kv_cache_usage", "prompt_tokens_total", "generation_tokens_total",
               "prefix_cache_queries_total", "prefix_cache_hits_total", "requests_finished_total"]
    def row():
        try:
            done = sum(1 for _ in open(os.path.join(out, "requests.jsonl")))
        except FileNotFoundError:
            done = 0
        return f"{time.time():.3f},0.5,0,{10 * done},0,0,{done}\\n"
    with open(os.path.join(out, "server_metrics.csv"), "w") as fh:
        fh.write(",".join(columns) + "\\n" + row()); fh.flush()
        try:
            while True:
                time.sleep(0.1)
                fh.write(row()); fh.flush()
        finally:
            fh.write(row())
    """
)


@pytest.fixture
def standins(tmp_path: Path) -> dict[str, list[str]]:
    """argv prefixes of the stand-ins (append their flags)."""
    d = tmp_path / "standins"
    d.mkdir()
    paths = {}
    for name, src in (
        ("engine", STANDIN_ENGINE),
        ("replayer", STANDIN_REPLAYER),
        ("scraper", STANDIN_SCRAPER),
    ):
        path = d / f"{name}.py"
        path.write_text(src)
        paths[name] = [sys.executable, str(path)]
    return paths
