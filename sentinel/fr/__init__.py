"""sentinel.fr."""
