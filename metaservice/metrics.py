"""Prometheus metrics of one service process."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

BARRIERS = Counter("metaservice_batch_barriers_total", "Batch barrier requests answered")
COMMITS = Counter("metaservice_commit_reports_total", "Commit reports by outcome", ["result"])
REQUESTS = Histogram(
    "metaservice_http_request_duration_seconds",
    "HTTP request latency by route",
    ["method", "route", "status"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
