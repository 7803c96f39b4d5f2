"""``python -m metaservice.cli``: the ``metaservice`` command."""

from metaservice.cli import app

app()
