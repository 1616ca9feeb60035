"""InfiniBand / RoCE ports: ``sysfs.py`` (the reader, under a configurable root) and ``topology.py`` (which
GPUs a port serves), ``record.py`` (the typed record on the wire and in the rules), ``tracker.py`` (rates,
error windows and link-down history that survive agent restarts), ``metrics.py`` (``sentinel_ib_port_*``),
``collector.py`` (the agent's collector), ``rule.py`` (port health policy)."""
