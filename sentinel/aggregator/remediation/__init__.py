"""Acting on verdicts through Slurm: policy (pure), circuit breaker (counted from Slurm), audit log, remediator.

See :mod:`sentinel.aggregator.remediation.remediator` for the flow and docs/remediation.md for operators.
"""

from sentinel.aggregator.remediation.policy import BreakerCheck, check_breaker, wants_drain
from sentinel.aggregator.remediation.remediator import Remediator

__all__ = ["BreakerCheck", "Remediator", "check_breaker", "wants_drain"]
