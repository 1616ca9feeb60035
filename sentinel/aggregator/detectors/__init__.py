"""Detectors: each a pure function of fleet state and ``now`` returning the findings true at that instant.

``hardware`` (per GPU), ``stuck`` (per job), ``straggler`` (peer comparison, with persistence), ``host_silent``.
The engine reconciles their findings into verdicts (:mod:`sentinel.aggregator.verdicts`).
"""
