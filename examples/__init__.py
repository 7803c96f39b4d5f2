"""Runnable examples of MetaService with barrier-aligned Spark jobs."""
