"""The barrier clock, batch barriers, aligned targets and commit reports."""
