"""Clocks, clock-event (throttle) reasons, temperature and power: ``nvml.py`` fills ``GpuSample``'s clock
fields; ``record.py`` names the reason bits once (and which are thermal / power); ``metrics.py`` exports
them; the aggregator's straggler detector reads thermal / power throttling as a reason a GPU is slow.
"""
