"""OpenLineage out: events about the barrier jobs, queued in the database.

The events are written by the transaction that makes them happen, so none is lost and
none is made up by a transaction that rolled back (a transactional outbox): a hook on
the service's write sessions sees, at each flush,

* a job's listener event (``POST /jobs/{job}/events``): ``started`` is START,
  ``terminated`` COMPLETE, ``failed`` FAIL (with the error message);
* a batch becoming committed (its last commit report): RUNNING, with the run facet
  ``metaservice_batch`` (batch id, barrier, the job's frontier, and the Iceberg
  snapshot id of each output),

and adds the event to ``openlineage_outbox``. :mod:`metaservice.openlineage.sender`
delivers the queue. A run is the Spark query run the listener reports (its ``runId``);
for a job no listener reports on, one run per Spark query id.

    >>> emitting = start_emitting(db, ctx)  # None when no OpenLineage URL is set
    >>> emitting.stop()
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attr
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import RunFacet, error_message_run, job_type_job
from openlineage.client.serde import Serde
from sqlalchemy import event, insert, inspect
from sqlalchemy.orm import Session, UOWTransaction

from metaservice import __version__
from metaservice.context import Context
from metaservice.db import Database
from metaservice.logs import redact_url
from metaservice.models import Batch, OpenLineageOutbox
from metaservice.models import Job as JobRow
from metaservice.openlineage import repository as repo
from metaservice.openlineage.sender import Sender

log = logging.getLogger(__name__)

PRODUCER = f"urn:metaservice:{__version__}"
BATCH_FACET = "metaservice_batch"
BATCH_FACET_SCHEMA = "urn:metaservice:facets:BarrierBatchRunFacet:1"
# The uuid5 namespace of run ids made up for jobs whose listener reports no run id.
RUN_NAMESPACE = uuid.UUID("6c0d5a4e-3f5b-4d0e-9a47-6d6574617376")
LISTENER_STATES = {
    "started": RunState.START,
    "terminated": RunState.COMPLETE,
    "failed": RunState.FAIL,
}


@attr.define
class BarrierBatchRunFacet(RunFacet):
    """What one committed batch of a barrier job made: its barrier, the job's frontier
    after it (both epoch milliseconds: barriers are times) and each output's snapshot."""

    batchId: int  # noqa: RUF100 (OpenLineage fields are camelCase)
    barrier: int
    frontier: int
    snapshots: list[dict[str, Any]] = attr.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return BATCH_FACET_SCHEMA


class Emitter:
    """Queues events for the barrier jobs of one database; see the module docstring."""

    def __init__(self, db: Database, ctx: Context, sender: Sender | None = None) -> None:
        self.db, self.ctx = db, ctx
        self.namespace = ctx.settings.openlineage_namespace
        self.sender = sender

    # -- from the flush hook --------------------------------------------------------------

    def events(self, session: Session) -> list[tuple[str, str, str]]:
        """(job, event type, JSON) for what this flush changed."""
        out: list[tuple[str, str, str]] = []
        for obj in [*session.new, *session.dirty]:
            if isinstance(obj, Batch) and _became_committed(obj) and not obj.advanced:
                made = self._running(session, obj)
                if made is not None:
                    out.append(made)
            elif isinstance(obj, JobRow):
                added: Sequence[Any] = inspect(obj).attrs.last_event.history.added or ()
                if added and added[-1]:
                    made = self._listener_event(session, obj, str(added[-1]))
                    if made is not None:
                        out.append(made)
        return out

    def _listener_event(
        self, session: Session, job: JobRow, raw: str
    ) -> tuple[str, str, str] | None:
        try:
            reported = json.loads(raw)
        except ValueError:
            return None
        state = LISTENER_STATES.get(reported.get("event"))
        if state is None:
            return None
        facets: dict[str, Any] = {}
        if state is RunState.FAIL and reported.get("message"):
            facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=reported["message"], programmingLanguage="JVM", producer=PRODUCER
            )
        run_id = self._run_id(job.name, reported.get("run_id"), None)
        return self._event(session, job, state, run_id, facets)

    def _running(self, session: Session, batch: Batch) -> tuple[str, str, str] | None:
        job = session.get(JobRow, batch.job_id)
        if job is None:
            return None
        facet = BarrierBatchRunFacet(
            batchId=batch.batch_id,
            barrier=batch.barrier,
            frontier=job.frontier,
            snapshots=[
                {"table": table, "snapshotId": snapshot}
                for table, snapshot in repo.batch_snapshots(session, job.id, batch.batch_id)
            ],
            producer=PRODUCER,
        )
        run_id = self._run_id(job.name, _last_run_id(job), batch.query_id)
        return self._event(session, job, RunState.RUNNING, run_id, {BATCH_FACET: facet})

    def _run_id(self, job: str, run_id: str | None, query_id: str | None) -> str:
        if run_id:
            try:
                return str(uuid.UUID(run_id))
            except ValueError:
                pass
        seed = f"{self.namespace}/{job}/{run_id or query_id or ''}"
        return str(uuid.uuid5(RUN_NAMESPACE, seed))

    def _event(
        self,
        session: Session,
        job: JobRow,
        state: RunState,
        run_id: str,
        run_facets: dict[str, Any],
    ) -> tuple[str, str, str]:
        inputs, outputs = repo.job_tables(session, job.id)
        when = datetime.fromtimestamp(self.ctx.now_ms() / 1000, tz=UTC)
        made = RunEvent(
            eventType=state,
            eventTime=when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            run=Run(runId=run_id, facets=run_facets),
            job=Job(
                namespace=self.namespace,
                name=job.name,
                facets={
                    "jobType": job_type_job.JobTypeJobFacet(
                        processingType="STREAMING",
                        integration="SPARK",
                        jobType="QUERY",
                        producer=PRODUCER,
                    )
                },
            ),
            inputs=[InputDataset(namespace=self.namespace, name=t) for t in inputs],
            outputs=[OutputDataset(namespace=self.namespace, name=t) for t in outputs],
            producer=PRODUCER,
        )
        return job.name, state.value, Serde.to_json(made)

    # -- the hook ---------------------------------------------------------------------------

    def install(self) -> None:
        with _LOCK:
            if not _EMITTERS:
                event.listen(Session, "after_flush", _after_flush)
                event.listen(Session, "after_commit", _after_commit)
            _EMITTERS[self.db.engine.pool] = self

    def uninstall(self) -> None:
        with _LOCK:
            _EMITTERS.pop(self.db.engine.pool, None)
            if not _EMITTERS:
                event.remove(Session, "after_flush", _after_flush)
                event.remove(Session, "after_commit", _after_commit)

    def stop(self) -> None:
        self.uninstall()
        if self.sender is not None:
            self.sender.stop()


_LOCK = threading.Lock()
_EMITTERS: dict[Any, Emitter] = {}  # by the connection pool of the Database they watch


def _emitter(session: Session) -> Emitter | None:
    return _EMITTERS.get(getattr(session.bind, "pool", None)) if _EMITTERS else None


def _after_flush(session: Session, _flush: UOWTransaction) -> None:
    emitter = _emitter(session)
    if emitter is None:
        return
    made = emitter.events(session)
    if not made:
        return
    now = int(time.time() * 1000)  # the queue runs on wall-clock time, whatever the clock
    # Inside the flush the Session may not take new objects: insert through its connection.
    session.connection().execute(
        insert(OpenLineageOutbox),
        [
            {
                "job": job,
                "event_type": state,
                "payload": payload,
                "created_ms": now,
                "due_ms": now,
                "attempts": 0,
            }
            for job, state, payload in made
        ],
    )
    session.info["openlineage_queued"] = True


def _after_commit(session: Session) -> None:
    if session.info.pop("openlineage_queued", False):
        emitter = _emitter(session)
        if emitter is not None and emitter.sender is not None:
            emitter.sender.wake()


def _became_committed(batch: Batch) -> bool:
    added: Sequence[Any] = inspect(batch).attrs.committed.history.added or ()
    return True in added


def _last_run_id(job: JobRow) -> str | None:
    if not job.last_event:
        return None
    try:
        run_id = json.loads(job.last_event).get("run_id")
    except ValueError:
        return None
    return str(run_id) if run_id else None


def start_emitting(db: Database, ctx: Context) -> Emitter | None:
    """Queue and send events for the barrier jobs when an OpenLineage URL is set."""
    if not ctx.settings.openlineage_url:
        return None
    sender = Sender(db, ctx.settings).start()
    emitter = Emitter(db, ctx, sender)
    emitter.install()
    log.info("emitting OpenLineage events to %s", redact_url(ctx.settings.openlineage_url))
    return emitter
