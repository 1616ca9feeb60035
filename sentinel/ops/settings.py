"""The settings the operations artifacts are built from: the agent's and the aggregator's configuration.

``sentinel rules build`` and ``sentinel dashboards build`` read thresholds from these (defaults unless a
configuration file is given), the same values the daemons' rules judge with.
"""

from __future__ import annotations

import msgspec

from sentinel.config.agent import AgentConfig
from sentinel.config.aggregator import AggregatorConfig


class OpsSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Both daemons' configuration, as the alerts and panels see it."""

    agent: AgentConfig = msgspec.field(default_factory=AgentConfig)
    aggregator: AggregatorConfig = msgspec.field(default_factory=AggregatorConfig)
