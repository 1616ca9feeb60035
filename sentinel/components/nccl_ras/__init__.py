"""NCCL's RAS service (NCCL >= 2.24, 127.0.0.1:28028 on every node of a job): ``client.py`` (the text
protocol, with deadlines), ``parse.py`` (the status text → ``record.py``'s :class:`RasStatus`),
``collector.py`` (the agent queries when a job's rank 0 runs on the host), ``rule.py`` (what a status says
about a stall)."""
