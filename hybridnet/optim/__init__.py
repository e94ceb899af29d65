"""optim placeholder."""
