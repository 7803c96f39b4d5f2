"""Validation of job names and table identifiers (one place for both rules)."""

from __future__ import annotations

import re

from metaservice.errors import Invalid

# Anchored for the OpenAPI document and pydantic (where '$' ends the text). Python's '$'
# also matches before a final newline, so here they are applied with fullmatch only.
TABLE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$"
JOB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$"
_TABLE = re.compile(TABLE_PATTERN)
_JOB = re.compile(JOB_PATTERN)


def is_table_name(name: str) -> bool:
    """Whether ``name`` is a table identifier, the whole of it (``'ods.a\\n'`` is not).

    >>> is_table_name("ods.orders"), is_table_name("ods.orders\\n")
    (True, False)
    """
    return len(name) <= 400 and _TABLE.fullmatch(name) is not None


def is_job_name(name: str) -> bool:
    return _JOB.fullmatch(name) is not None


def check_table_name(name: str, field: str = "table") -> str:
    if not is_table_name(name):
        raise Invalid(
            f"'{name}' is not a table identifier: use namespace.name "
            "(letters, digits and underscores, e.g. dw.order_detail)",
            field=field,
        )
    return name


def check_job_name(name: str, field: str = "job") -> str:
    if not is_job_name(name):
        raise Invalid(
            f"'{name}' is not a job name: 1-200 letters, digits, '_', '.', '-', "
            "starting with a letter or digit",
            field=field,
        )
    return name
