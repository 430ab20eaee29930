"""Test and demo harness: simulated populations, replayed event files and the exact ground truth of a run.

Not device code: a device privatizes and sends (:mod:`producers`); this package makes up or reads the raw events
that ``ptel produce``, ``ptel demo``, the benchmarks and the tests feed to the devices, and keeps what the releases
estimate. One module per metric kind under :mod:`workloads.kinds` (registry: :data:`workloads.kinds.WORKLOADS`).
"""
