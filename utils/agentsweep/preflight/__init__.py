"""Preflight: what a cell needs from the cluster, checked in seconds before anything is allocated.

``agentsweep preflight --key KEY`` (or ``--cell JSON``): the Slurm partition, account, GRES type and
node count; the container runtime and the image (present, or pullable with its digest); the model
(in the HF cache, or downloadable with the token) against free disk; the traces; and on the nodes
themselves (one short Slurm job) the GPUs the runner claims, the memory of the offload budget and
the fixed ports. Modules: ``report`` (the check and report types), ``slurm``, ``container``, ``hub``
(model, traces, disk), ``node`` (runs on a node; stdlib only), ``run`` (all of them for a key), ``cli``.

This package's ``__init__`` imports nothing, so ``python -m agentsweep.preflight.node`` runs on a
node with any Python.
"""
