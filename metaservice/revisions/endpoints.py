from __future__ import annotations

from fastapi import APIRouter, Body, Depends, Path, Response

from metaservice.auth.schemas import Role
from metaservice.deps import Paging, Services, paging, require, services
from metaservice.lifecycle.endpoints import CATALOG_UNAVAILABLE
from metaservice.revisions import mirrors, service, swap
from metaservice.revisions.schemas import (
    MAX_REVISION_ID,
    RevisionRequest,
    RevisionView,
    SwapRequest,
)
from metaservice.schemas_common import Page, error_responses

router = APIRouter(tags=["revisions"], dependencies=[require(Role.READER)])

# revisions.id is an INTEGER column: a larger id is no revision (422, not a database error)
RevisionId = Path(ge=1, le=MAX_REVISION_ID, description="The revision's id")


@router.post(
    "/revisions",
    response_model=RevisionView,
    status_code=201,
    dependencies=[require(Role.ADMIN)],
    responses={**error_responses(400, 404, 409, 413), **CATALOG_UNAVAILABLE},
)
def create_revision(body: RevisionRequest, s: Services = Depends(services)) -> RevisionView:
    """Plan a revision of ``table`` from ``from_barrier`` (admin): the affected set is the
    table, its writer's other outputs and everything downstream; each gets a mirror table
    in the jobs' catalog whose history starts at its snapshot at ``from_barrier``
    (metadata only: no data is copied). ``must_run`` names the jobs to re-run and which
    inputs each reads from a mirror. All or nothing. 409 ``no_writer``, ``not_reached``,
    ``not_exact``, ``expired``, ``revision_overlaps``, ``not_in_catalog``,
    ``mirror_exists``: nothing changed."""
    return mirrors.create_revision(s.db, s.ctx, body)


@router.get("/revisions", response_model=Page[RevisionView], responses=error_responses(413))
def list_revisions(
    page: Paging = Depends(paging), s: Services = Depends(services)
) -> Page[RevisionView]:
    """Every revision, newest first, with its mirrors' start snapshots and frontiers."""
    return s.db.read(
        lambda session: service.list_revisions(session, s.ctx, page.limit, page.offset)
    )


@router.get("/revisions/{revision_id}", response_model=RevisionView, responses=error_responses(404))
def get_revision(revision_id: int = RevisionId, s: Services = Depends(services)) -> RevisionView:
    """The revision: its state and, per mirror, its start snapshot, frontier and lag.
    404 ``unknown_revision``."""
    return s.db.read(lambda session: service.get_revision(session, s.ctx, revision_id))


@router.post(
    "/revisions/{revision_id}/swap",
    response_model=RevisionView,
    dependencies=[require(Role.ADMIN)],
    responses={
        202: {"model": RevisionView, "description": "Still swapping: POST again to continue"},
        **error_responses(400, 404, 409, 413),
        **CATALOG_UNAVAILABLE,
    },
)
def swap_revision(
    response: Response,
    revision_id: int = RevisionId,
    body: SwapRequest | None = Body(None),
    s: Services = Depends(services),
) -> RevisionView:
    """Swap a ready revision's mirrors in for their originals (admin). The original
    writers are superseded first: their next barrier request is 409 ``superseded`` (the
    reports of batches they opened before are still recorded). Once every mirror's
    frontier has reached its original's, one transaction renames each original ``t`` to
    ``t__pre_rev<id>`` and its mirror to ``t`` (in the catalog too, when it is the SQL
    catalog in the MetaService's database): consistent versions go from all-old to
    all-new at once, their barriers never going back. 200 ``swapped``; 202 ``swapping``
    when the mirrors did not get there within ``wait_seconds`` (POST again to continue).
    With any other catalog the renames follow that commit as journaled steps: 503
    ``catalog_unavailable`` (or 409 ``swap_blocked``) when one fails, and POST again
    finishes the same renames; swapping a swapped revision changes nothing.
    409 ``not_ready``, ``revision_cancelled``; 404 ``unknown_revision``."""
    wait = (body or SwapRequest()).wait_seconds
    view = swap.swap_revision(s.db, s.ctx, revision_id, wait)
    if view.state != "swapped":
        response.status_code = 202
    return view


@router.delete(
    "/revisions/{revision_id}",
    response_model=RevisionView,
    dependencies=[require(Role.ADMIN)],
    responses={**error_responses(404, 409), **CATALOG_UNAVAILABLE},
)
def cancel_revision(revision_id: int = RevisionId, s: Services = Depends(services)) -> RevisionView:
    """Cancel the revision (admin): state ``cancelled``, its mirrors dropped from the
    catalog without deleting any file (they are the original's). Cancelling a cancelled
    revision answers it again. 409 ``revision_swapped`` for a swapped revision (its
    mirrors are the tables now). 404 ``unknown_revision``."""
    return mirrors.cancel_revision(s.db, s.ctx, revision_id)
