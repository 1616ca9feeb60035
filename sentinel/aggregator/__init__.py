"""sentinel.aggregator."""
