"""sentinel.aggregator.detectors."""
