"""API tokens: who may call the service, and with which role."""

from __future__ import annotations

from sqlalchemy import BigInteger, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from metaservice.models.base import Base


class ApiToken(Base):
    """A bearer token, kept only as the SHA-256 of its text: the database never holds
    a token anyone could present. ``role`` is ``reader``, ``writer`` or ``admin``;
    ``jobs``, for a writer, the comma-separated job names or patterns it may act for
    (None: every job)."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    description: Mapped[str] = mapped_column(Text, default="")
    created_ms: Mapped[int] = mapped_column(BigInteger)
    jobs: Mapped[str | None] = mapped_column(Text, nullable=True)
