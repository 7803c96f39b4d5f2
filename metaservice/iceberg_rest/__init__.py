"""The Iceberg REST catalog, read-only, at ``/iceberg``: every table of one engine's
catalog session at one consistent version (see ``service``)."""
