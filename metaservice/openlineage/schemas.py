"""OpenLineage events as the service reads them (spec 2-0-x), and its answers.

Only what the service uses is checked; everything else, unknown facets included, is
allowed and kept with the event as it came.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, get_args
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

NO_NUL = r"^[^\x00]*$"  # PostgreSQL text cannot hold NUL characters
MAX_DATASETS = 1000

Name = Annotated[str, StringConstraints(min_length=1, max_length=1000, pattern=NO_NUL)]
EventType = Literal["START", "RUNNING", "COMPLETE", "ABORT", "FAIL", "OTHER"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class JobRef(_Open):
    namespace: Name
    name: Name
    facets: dict[str, Any] = Field(default_factory=dict)


class RunRef(_Open):
    runId: UUID
    facets: dict[str, Any] = Field(default_factory=dict)


class DatasetRef(_Open):
    namespace: Name
    name: Name
    facets: dict[str, Any] = Field(default_factory=dict)


class SymlinkIdentifier(_Open):
    namespace: Name
    name: Name
    type: str = Field("TABLE", max_length=100)


class SymlinksFacet(_Open):
    """The ``symlinks`` dataset facet: other names of the dataset (a table identifier
    for an Iceberg table named by location)."""

    identifiers: list[SymlinkIdentifier] = Field(default_factory=list, max_length=100)


class EventIn(_Open):
    eventTime: datetime
    producer: str = Field(min_length=1, max_length=2000)
    schemaURL: str | None = Field(None, max_length=2000)


class RunEventIn(EventIn):
    eventType: EventType | None = None
    run: RunRef
    job: JobRef
    inputs: list[DatasetRef] = Field(default_factory=list, max_length=MAX_DATASETS)
    outputs: list[DatasetRef] = Field(default_factory=list, max_length=MAX_DATASETS)


class JobEventIn(EventIn):
    job: JobRef
    inputs: list[DatasetRef] = Field(default_factory=list, max_length=MAX_DATASETS)
    outputs: list[DatasetRef] = Field(default_factory=list, max_length=MAX_DATASETS)


class DatasetEventIn(EventIn):
    dataset: DatasetRef


EVENT_MODELS: dict[str, type[EventIn]] = {
    "run": RunEventIn,
    "job": JobEventIn,
    "dataset": DatasetEventIn,
}


class IngestResult(BaseModel):
    """The answer to ``POST /lineage``."""

    status: Literal["recorded", "duplicate", "ignored"] = Field(
        description="recorded: a new event; duplicate: this very event was recorded before "
        "(a client's retry), nothing changed; ignored: an event type the service does not "
        "know, acknowledged as Marquez does"
    )
    kind: str | None = Field(
        None, description="'run', 'job' or 'dataset' (RunEvent, JobEvent, DatasetEvent)"
    )
    event_id: str | None = Field(
        None, description="SHA-256 of the event's canonical JSON: the same event, the same id"
    )


# The request body as documented; the endpoint reads the raw body itself (gzip, and
# errors that name the JSON path of the problem).
EVENT_BODY_SCHEMA: dict[str, Any] = {
    "description": "An OpenLineage RunEvent, JobEvent or DatasetEvent (spec 2-0-x), told "
    "apart by the fragment of schemaURL (#/$defs/RunEvent...) or else by which of run, "
    "dataset, job it has. May be sent with Content-Encoding: gzip.",
    "type": "object",
    "required": ["eventTime", "producer"],
    "additionalProperties": True,
    "properties": {
        "eventTime": {"type": "string", "format": "date-time"},
        "producer": {"type": "string"},
        "schemaURL": {"type": "string"},
        "eventType": {"type": "string", "enum": list(get_args(EventType))},
        "run": {"type": "object"},
        "job": {"type": "object"},
        "dataset": {"type": "object"},
        "inputs": {"type": "array", "items": {"type": "object"}},
        "outputs": {"type": "array", "items": {"type": "object"}},
    },
}
