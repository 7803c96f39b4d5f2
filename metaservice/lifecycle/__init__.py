"""Which snapshots may be expired, and why the others are kept."""
