"""sentinel.sim."""
