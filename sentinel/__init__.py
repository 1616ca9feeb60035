"""sentinel: find the one GPU that stalls a training job.

A per-host agent collects NVML metrics, Xid events, row-remapping and ECC state, NCCL/PyTorch logs and
flight-recorder progress; an aggregator correlates the hosts of each job and names the faulty, stuck or
slow GPU with evidence and a recommended action.
"""

__version__ = "0.1.0"
