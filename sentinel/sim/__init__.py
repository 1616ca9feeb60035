"""The simulated cluster behind ``sentinel sim`` and ``sentinel demo``.

- :func:`sentinel.sim.scenario.load_scenario` — validated scenario files (contract section 4);
- :func:`sentinel.sim.runner.run_scenario` — virtual-clock run through the real aggregator engine → report;
- :func:`sentinel.sim.host.sim_hosts` — :class:`~sentinel.sim.host.SimHost` objects (GpuSource + HostExtras)
  for real agents in real time.
"""
