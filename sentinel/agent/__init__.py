"""sentinel.agent."""
