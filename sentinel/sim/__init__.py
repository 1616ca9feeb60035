"""The simulated cluster behind ``sentinel sim``, ``sentinel demo`` and ``sentinel agent run --simulate``.

- :func:`sentinel.sim.scenario.load_scenario` — validated scenario files (contract section 4);
- :func:`sentinel.sim.runner.run_scenario` — virtual-clock run: the real agent (inline) on every simulated
  host, through the real aggregator engine → report;
- :func:`sentinel.sim.host.sim_hosts` — :class:`~sentinel.sim.host.SimHost` objects: each a GPU source and
  the host's other OS boundaries (kernel log, job logs, processes, probe datagrams, IB ports) for real agents.
"""
