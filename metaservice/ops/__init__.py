"""Health, readiness and metrics endpoints."""
