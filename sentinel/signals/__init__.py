"""sentinel.signals."""
