"""The simulated GPUs' meter behind the DCGM metrics of engine-sim (engine_sim.metrics.GpuMeter): what a
power sampler reads of it depends only on when it reads, not on who else scrapes the same /metrics in
between (the cell's metrics collector does, about once a second), and its power is the mean of the
draw its energy counter integrates."""

from __future__ import annotations

import pytest
from agentsweep.engine_sim.metrics import GpuMeter, GpuModel, GpuWork

MODEL = GpuModel(
    hardware="h200",
    gpus=1,
    board_power_w=700.0,
    idle_power_w=125.0,
    step_s=0.005,
    prefill_token_s=1e-4,
    decode_token_s=1e-3,
    weight_read_s=0.005,
    memory_used_mib=1000.0,
)
# (prompt tokens/s, generated tokens/s, steps/s) of each engine second: 40 s of prefill bursts between
# decode seconds, 20 s of steady decode, 20 s idle (no load reaches the model's caps).
PREFILL, DECODE, IDLE = (6000, 100, 40), (0, 400, 60), (0, 0, 0)
SECONDS = [PREFILL if s % 2 == 0 else DECODE for s in range(40)] + [DECODE] * 20 + [IDLE] * 20
SAMPLER_S = 2.5  # the power sampler's interval, in engine seconds
WINDOW_S = 4 * SAMPLER_S


class Clock:
    """The engine's cumulative work at the engine second it is set to."""

    def __init__(self) -> None:
        self.t = 0.0

    def work(self) -> GpuWork:
        done = [0.0, 0.0, 0.0]
        for second, rates in enumerate(SECONDS):
            span = max(0.0, min(self.t - second, 1.0))
            done = [d + r * span for d, r in zip(done, rates, strict=True)]
        prompt, generated, steps = (round(d) for d in done)
        return GpuWork(self.t, prompt, generated, steps)


def sampled(collector_reads: bool) -> list[tuple[float, float, float]]:
    """(power, energy, utilisation) the sampler reads every SAMPLER_S, with or without a second reader
    scraping half a second before each of its reads."""
    clock = Clock()
    meter = GpuMeter(MODEL, clock.work, WINDOW_S)
    out = []
    for k in range(1, 32):
        if collector_reads:
            clock.t = k * SAMPLER_S - 0.5
            meter.read()
        clock.t = k * SAMPLER_S
        m = meter.read()
        out.append((m.power_w, m.energy_j, m.util))
    return out


def test_another_reader_changes_nothing_the_sampler_reads():
    alone, beside = sampled(collector_reads=False), sampled(collector_reads=True)
    assert [pytest.approx(r) for r in alone] == beside


def test_power_is_the_mean_of_the_draw_the_counter_counts_over_the_last_window():
    readings = sampled(collector_reads=True)
    energy = [0.0] + [e for _, e, _ in readings]  # at 0, SAMPLER_S, 2 x SAMPLER_S, ...
    per_window = round(WINDOW_S / SAMPLER_S)
    for k, (power, _, _) in enumerate(readings, start=1):
        back = max(0, k - per_window)  # the engine's start, until it has run a whole window
        mean = (energy[k] - energy[back]) / ((k - back) * SAMPLER_S)
        assert power == pytest.approx(mean), k
    # A steady load reads steady power: the decode phase's once the window lies wholly inside it.
    decode = 125.0 + (700.0 - 125.0) * (400 * 1e-3 + 0.6 * 60 * 0.005)
    assert readings[19][0] == pytest.approx(decode)  # at 50 s: the window is 40-50 s
    assert readings[-1][0] == pytest.approx(125.0) and readings[-1][2] == 0.0  # idle since 60 s
