"""``sentinel demo``: the embedded default — a simulated cluster, real agents, a real aggregator, on 127.0.0.1.

Pieces: :mod:`~sentinel.demo.scenarios` (the built-in scenario and ``--hosts`` resizing),
:mod:`~sentinel.demo.run` (orchestration), :mod:`~sentinel.demo.watch` (the aggregator's REST API as the
demo sees it), :mod:`~sentinel.demo.outcome` (which verdict caught which fault), :mod:`~sentinel.demo.view`
and :mod:`~sentinel.demo.narrate` (terminal view, plain log lines), :mod:`~sentinel.demo.summary`.
"""
