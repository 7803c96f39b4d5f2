"""Revisions: re-running a table and everything downstream of it from a barrier into
mirror tables (metadata-only copies of the originals at that barrier), without readers
of the originals seeing anything of it."""
