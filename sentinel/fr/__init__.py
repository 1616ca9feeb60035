"""PyTorch Flight Recorder: post-mortem dump analysis and live collective progress.

Post-mortem (``sentinel fr analyze``): :func:`sentinel.fr.dumpset.analyze_dir` reads every rank's dump
(:mod:`~sentinel.fr.loader`, :mod:`~sentinel.fr.safepickle`), reduces each one
(:func:`sentinel.fr.summary.summarize`) and analyzes them together (:func:`sentinel.fr.analysis.analyze`).

Live: :mod:`sentinel.probe` sends :class:`~sentinel.fr.heads.FrHeads` built by
:func:`sentinel.fr.reduce.reduce_snapshot` and step times from :mod:`sentinel.fr.steps`; the aggregator's
stuck detector (:mod:`sentinel.aggregator.detectors.stuck`) judges them; the agent triggers job-wide dumps with :func:`sentinel.fr.trigger.trigger_dumps`. Both sides follow waits
across process groups with :func:`sentinel.fr.waitgraph.find_culprits`: one stall algorithm.
"""
