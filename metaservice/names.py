"""Validation of job names and table identifiers (one place for both rules)."""

from __future__ import annotations

import re

from metaservice.errors import Invalid

TABLE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"
JOB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$"
_TABLE = re.compile(TABLE_PATTERN)
_JOB = re.compile(JOB_PATTERN)


def check_table_name(name: str, field: str = "table") -> str:
    if len(name) > 400 or not _TABLE.match(name):
        raise Invalid(
            f"'{name}' is not a table identifier: use namespace.name "
            "(letters, digits and underscores, e.g. dw.order_detail)",
            field=field,
        )
    return name


def check_job_name(name: str, field: str = "job") -> str:
    if not _JOB.match(name):
        raise Invalid(
            f"'{name}' is not a job name: 1-200 letters, digits, '_', '.', '-', "
            "starting with a letter or digit",
            field=field,
        )
    return name
