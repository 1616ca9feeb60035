"""The cluster-side aggregator: ingest, fleet state, detectors, verdicts, incidents, REST API.

Public entry points:

- :func:`sentinel.aggregator.server.create_app` — the aiohttp application (``app[AGGREGATOR_KEY]`` is the
  running :class:`~sentinel.aggregator.server.Aggregator`);
- :class:`sentinel.aggregator.engine.Engine` — the same logic without I/O (``hello``/``ingest``/``tick`` with
  an injected clock), used by ``sentinel sim``;
- :mod:`sentinel.aggregator.detectors` — one module per detector, pure functions of state and time.
"""
