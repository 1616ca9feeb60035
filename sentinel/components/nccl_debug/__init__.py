"""NCCL / PyTorch async-debug readiness of a job, from its ranks' environment: are the settings that make a
stall diagnosable switched on? ``record.py`` (what ships in ProcInfo), ``rule.py`` (environment → readiness,
with the reason for every recommended setting)."""
