"""The power sampler: one reader per target (a tool run on a node, or a metrics endpoint), every
reading appended to power.csv as it arrives, until SIGTERM/SIGINT.

A source that is missing, fails, prints something unexpected or loses a GPU never stops the sampler
or the cell: it becomes a fault row in power.csv (one per cause, with the line for unparsable
output), which the power summary turns into ``power_valid`` false. The tools run in the sampler's
own process group (the cell stops the group) and die with it; a tool on another node runs in a job
step there (``PowerTarget.prefix``), which ends when its ``srun`` is terminated.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, TextIO

from agentsweep.energy import amd_smi, dcgm, nvidia_smi
from agentsweep.energy.powercsv import GpuReading, PowerCsvWriter, one_line
from agentsweep.energy.spec import PowerTarget, SamplerSpec
from agentsweep.metrics.dialects import Exposition
from agentsweep.watchdog import die_with_parent, stop_on_signal

MAX_REPLY_BYTES = 8 << 20
MAX_LINE_CHARS = 1 << 16
GPUS_LINE = "#gpus"
# A GPU silent this many intervals (and at least MIN_SILENCE_S) while its node's tool reports: gone.
SILENT_INTERVALS = 6
MIN_SILENCE_S = 3.0
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Sampler:
    """Samples ``spec`` into ``output`` until ``stop`` is set."""

    def __init__(self, spec: SamplerSpec, output: Path, log: TextIO = sys.stderr) -> None:
        self.spec = spec
        self.output = output
        self.stop = threading.Event()
        self.log = log
        self._writer = PowerCsvWriter(output)
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen[str]] = []
        self._faults: set[tuple[str, str]] = set()
        self.samples = 0

    # -- writing -------------------------------------------------------------------------------
    def emit(self, time_s: float, target: PowerTarget, reading: GpuReading) -> None:
        named = GpuReading(
            target.gpu_name(reading.gpu),
            reading.power_w,
            reading.energy_j,
            reading.temp_c,
            reading.util_pct,
            reading.mem_used_mib,
        )
        with self._lock:
            self._writer.sample(time_s, target.node, named)
            self.samples += 1

    def fault(
        self,
        target: PowerTarget,
        text: str,
        gpu: str = "",
        *,
        once_key: str | None = None,
        at: float | None = None,
    ) -> None:
        """A fault row (and a log line), dated ``at`` (default: now); with ``once_key`` only the first
        of that kind per target."""
        if once_key is not None:
            key = (f"{target.node}|{target.label}", once_key)
            if key in self._faults:
                return
            self._faults.add(key)
        where = f"{self.spec.source} on {target.node}" + (f" ({target.label})" if target.label else "")
        line = f"{where}: {text}"
        with self._lock:
            self._writer.fault(
                time.time() if at is None else at, target.node, line, target.gpu_name(gpu) if gpu else ""
            )
        print(f"power-sampler: {one_line(line)}", file=self.log, flush=True)

    # -- running -------------------------------------------------------------------------------
    def run(self) -> int:
        """Sample until ``stop``; returns the samples written."""
        readers = {"nvidia-smi": self._nvidia_smi, "amd-smi": self._amd_smi, "dcgm": self._dcgm}
        read = readers[self.spec.source]
        threads = [
            threading.Thread(target=self._guarded, args=(read, t), name=f"power-{t.node}", daemon=True)
            for t in self.spec.targets
        ]
        for thread in threads:
            thread.start()
        self.stop.wait()
        for proc in list(self._procs):
            _terminate(proc)
        for thread in threads:
            thread.join(timeout=10.0)
        self.close()
        return self.samples

    def run_until_signalled(self) -> int:
        with stop_on_signal(self.stop):
            written = self.run()
        print(
            f"power-sampler: stopped; {written} samples written to {self.output}", file=self.log, flush=True
        )
        return written

    def _guarded(self, read: Callable[[PowerTarget], None], target: PowerTarget) -> None:
        """A reader that breaks is a fault of its target, never a dead sampler."""
        try:
            read(target)
        except Exception as err:  # a bug or an OS error in one reader: say so, keep the others
            self.fault(target, f"sampling stopped: {type(err).__name__}: {err}")

    def _start(self, target: PowerTarget, argv: list[str]) -> subprocess.Popen[str] | None:
        """Start ``argv`` (in a job step on the target's node when it has a prefix)."""
        full = [*target.prefix, *argv]
        try:
            proc = subprocess.Popen(
                full,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
                preexec_fn=die_with_parent(),
            )
        except OSError as err:
            self.fault(target, f"cannot run {full[0]}: {err.strerror or err}")
            return None
        self._procs.append(proc)
        if self.stop.is_set():
            _terminate(proc)
        return proc

    def _ended(self, target: PowerTarget, proc: subprocess.Popen[str], last: str) -> None:
        """The tool's output ended: a fault unless the sampler is stopping."""
        code = proc.wait()
        if not self.stop.is_set():
            hint = f"; last line: {one_line(last, 200)!r}" if last else ""
            self.fault(target, f"the tool exited with status {code}{hint}")

    def _learn_gpus(self, target: PowerTarget, line: str) -> tuple[str, ...] | None:
        """The ids of a ``#gpus`` line (a node other than the cell's), or None with a fault."""
        ids = tuple(i for i in line[len(GPUS_LINE) :].strip().split(",") if i)[: target.count]
        if len(ids) < target.count:
            self.fault(
                target,
                f"the job step shows {len(ids)} GPUs ({line.strip()!r}), the cell has {target.count} here",
            )
            return ids if ids else None
        return ids

    # -- nvidia-smi ----------------------------------------------------------------------------
    def _nvidia_smi(self, target: PowerTarget) -> None:
        interval = self.spec.interval_s
        if target.prefix:
            argv = ["bash", "-c", nvidia_smi.step_script(interval, GPUS_LINE)]
        else:
            argv = nvidia_smi.command(target.gpus, interval)
        proc = self._start(target, argv)
        if proc is None or proc.stdout is None:
            return
        expected = set(target.gpus)
        clock = nvidia_smi.NodeClock()
        watch = _Silence(max(SILENT_INTERVALS * interval, MIN_SILENCE_S))
        last = ""
        for number, raw in enumerate(_lines(proc.stdout), start=1):
            arrived = time.time()
            line = raw.strip()
            if not line or self.stop.is_set():  # what a stopped tool (or its srun) says last is no sample
                continue
            last = line
            if line.startswith(GPUS_LINE):
                expected = set(self._learn_gpus(target, line) or ())
                continue
            try:
                stamp, reading, uuid = nvidia_smi.parse_line(line)
                when = clock.unix(stamp, arrived)
            except nvidia_smi.GpuFault as err:
                self.fault(target, f"output line {number}: {err}", err.gpu, once_key=f"gpu-{err.gpu}")
                continue
            except ValueError as err:
                self.fault(target, f"output line {number}: {err}", once_key="unexpected")
                continue
            if uuid in expected:  # the cell named its GPUs by UUID: power.csv names them by index
                expected = (expected - {uuid}) | {reading.gpu}
            if expected and reading.gpu not in expected:
                text = f"output line {number}: GPU {reading.gpu} is not one of the cell's ({', '.join(sorted(expected))})"
                self.fault(target, text, once_key="stranger")
                continue
            self.emit(when, target, reading)
            for gpu, why in watch.seen(reading.gpu, arrived, expected):
                self.fault(target, f"GPU {gpu} {why}", gpu, once_key=f"gpu-{gpu}")
        self._ended(target, proc, last)

    # -- amd-smi -------------------------------------------------------------------------------
    def _amd_smi(self, target: PowerTarget) -> None:
        interval = self.spec.interval_s
        if target.prefix:
            script = amd_smi.step_script(target.count, interval, GPUS_LINE)
        else:
            script = amd_smi.loop_script(target.gpus, interval)
        proc = self._start(target, ["bash", "-c", script])
        if proc is None or proc.stdout is None:
            return
        expected = tuple(target.gpus)
        document: list[str] = []
        number = 0
        last = ""
        for raw in _lines(proc.stdout):
            number += 1
            if self.stop.is_set():  # what a stopped loop (or its srun) says last is no sample
                continue
            line = raw.rstrip("\n")
            if line.strip():
                last = line.strip()
            if line.startswith(GPUS_LINE):
                expected = self._learn_gpus(target, line) or ()
                continue
            if line.startswith(amd_smi.FAIL):
                self.fault(
                    target,
                    f"amd-smi exited with status {line[len(amd_smi.FAIL) :].strip()}; output: "
                    f"{one_line(' '.join(document), 200)!r}",
                    once_key="fail",
                )
                document = []
                continue
            if line.strip() != amd_smi.END:
                document.append(line)
                continue
            text, document = "\n".join(document), []
            if not text.strip():
                continue
            arrived = time.time()
            try:
                readings = amd_smi.parse_document(text)
            except ValueError as err:
                self.fault(target, f"output up to line {number}: {err}", once_key="unexpected")
                continue
            by_gpu = {r.gpu: r for r in readings}
            for gpu in expected or tuple(by_gpu):
                if gpu in by_gpu:
                    self.emit(arrived, target, by_gpu[gpu])
                else:
                    self.fault(
                        target, f"GPU {gpu} is missing from amd-smi's output", gpu, once_key=f"missing-{gpu}"
                    )
        self._ended(target, proc, last)

    # -- dcgm ----------------------------------------------------------------------------------
    def _dcgm(self, target: PowerTarget) -> None:
        ids: tuple[str, ...] = target.gpus
        if not ids and target.prefix:
            ids = self._step_gpus(target)
        interval = self.spec.interval_s
        timeout = min(5.0, max(1.0, 2 * interval))
        failing = False
        next_tick = time.monotonic()
        while True:
            stopping = self.stop.is_set()  # one last scrape after the stop: the counters at the end
            arrived = time.time()
            try:
                self.record_dcgm(target, ids, _fetch(target.endpoint, timeout), arrived)
            except (urllib.error.URLError, OSError, TimeoutError, ValueError) as err:
                if not failing:
                    self.fault(target, f"GET {target.endpoint} failed: {type(err).__name__}: {err}")
                failing = True
            else:
                failing = False
            if stopping:
                return
            next_tick += interval
            delay = next_tick - time.monotonic()
            if delay < 0:
                next_tick, delay = time.monotonic(), 0.0
            self.stop.wait(delay)

    def record_dcgm(
        self, target: PowerTarget, ids: tuple[str, ...], text: str | Exposition, arrived: float
    ) -> None:
        """One DCGM exposition (its text, or read in this process) read at Unix time ``arrived``: a row
        per GPU of ``ids`` (all when empty), a fault for each one absent (ValueError: not Prometheus
        text)."""
        found, absent = dcgm.pick(dcgm.parse_metrics(text), ids)
        for reading in found:
            self.emit(arrived, target, reading)
        for gpu in absent:
            self.fault(
                target,
                f"GPU {gpu} is absent from {target.endpoint}",
                gpu,
                once_key=f"absent-{gpu}",
                at=arrived,
            )

    def close(self) -> None:
        """Flush and close power.csv (``run`` does it when its threads are done)."""
        self._writer.close()

    def _step_gpus(self, target: PowerTarget) -> tuple[str, ...]:
        """A remote node's GPU ids for a DCGM endpoint, asked once in a job step there."""
        proc = self._start(target, ["bash", "-c", f'echo "{GPUS_LINE} ${{CUDA_VISIBLE_DEVICES-}}"'])
        if proc is None or proc.stdout is None:
            return ()
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            _terminate(proc)
            self.fault(target, "the job step that names the node's GPUs did not answer in 120 s")
            return ()
        line = next((ln for ln in out.splitlines() if ln.startswith(GPUS_LINE)), "")
        if not line:
            self.fault(target, f"the job step did not name the node's GPUs: {one_line(out, 200)!r}")
            return ()
        return self._learn_gpus(target, line) or ()


class _Silence:
    """Which GPUs of a tool's output went quiet while the others kept reporting."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.first: float | None = None
        self.last: dict[str, float] = {}

    def seen(self, gpu: str, now: float, expected: set[str]) -> list[tuple[str, str]]:
        """Record ``gpu`` at ``now``; (gpu, what happened) for each GPU silent past the limit."""
        self.first = now if self.first is None else self.first
        self.last[gpu] = now
        out = [
            (g, f"stopped reporting ({now - t:.1f} s without a line)")
            for g, t in self.last.items()
            if now - t > self.limit_s
        ]
        if now - self.first > self.limit_s:
            out += [(g, "never reported") for g in sorted(expected - self.last.keys())]
        return out


def _lines(stream: IO[str]) -> Iterator[str]:
    """The stream's lines, each cut to MAX_LINE_CHARS (a line without end is never held whole)."""
    while True:
        line = stream.readline(MAX_LINE_CHARS)
        if not line:
            return
        if len(line) == MAX_LINE_CHARS and not line.endswith("\n"):
            while (rest := stream.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                pass
        yield line


def _fetch(url: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    with _NO_PROXY.open(
        urllib.request.Request(url, headers={"Accept": "text/plain"}), timeout=timeout
    ) as resp:
        while chunk := resp.read1(1 << 16):
            size += len(chunk)
            if size > MAX_REPLY_BYTES:
                raise ValueError(f"reply larger than {MAX_REPLY_BYTES >> 20} MiB")
            if time.monotonic() > deadline:
                raise TimeoutError(f"reply not complete within {timeout:g} s")
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def _terminate(proc: subprocess.Popen[str], grace_s: float = 5.0) -> None:
    """SIGTERM (srun passes it to its step), then SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def sample(spec: SamplerSpec, output: Path, seconds: float) -> int:
    """Sample for ``seconds`` (tests and the probe script); returns the samples written."""
    sampler = Sampler(spec, output)
    timer = threading.Timer(seconds, sampler.stop.set)
    timer.start()
    try:
        return sampler.run()
    finally:
        timer.cancel()


__all__: Sequence[str] = ("Sampler", "sample")
