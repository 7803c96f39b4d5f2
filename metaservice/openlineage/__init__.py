"""OpenLineage both ways.

In: ``POST /api/v1/lineage`` takes RunEvent, JobEvent and DatasetEvent as Marquez does
(``endpoints``, ``service``); the jobs and datasets they name show in ``GET /lineage``
as observed lineage. Out: with ``openlineage_url`` set, events about the barrier jobs
are queued in the database as they happen (``emit``) and delivered by a background
sender (``sender``).
"""
