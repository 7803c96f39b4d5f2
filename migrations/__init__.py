"""Alembic migrations of the MetaService schema (applied by ``metaservice db upgrade``)."""
