"""sentinel.config."""
