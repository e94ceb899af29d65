"""nn placeholder."""
