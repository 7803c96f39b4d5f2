"""Snapshot lifecycle: the expiry plan, its execution (through pyiceberg), retention
policies and the expiry schedule."""
