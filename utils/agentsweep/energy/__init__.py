"""GPU power beside every cell: the sampler that writes power.csv, its sources (a DCGM exporter,
nvidia-smi, amd-smi) and the power summary other parts read.

- ``summary.power_summary(result_dir) -> PowerSummary``: a cell's energy over the measurement window, joules
  per output token, per total token and per successful request, average and p90 power, temperature and
  utilisation, ``power_valid`` with its ``reasons`` and ``audit`` (``summary``).
- ``powercsv``: power.csv, its writer and its one reader.
- ``sampler``: the process a cell starts beside its engines (``agentsweep power-sampler``).

docs/energy.md says what each source reports and in which unit. Nothing is imported here: the sampler,
a process of its own beside every cell, imports only its own modules (the summary's readers cost it
0.4 s of CPU at every start).
"""
