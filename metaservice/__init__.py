"""MetaService: timestamp barriers, lineage and consistent multi-table versions for
Spark streaming on Apache Iceberg.

The package is split by who needs what (see the README's "Install"):

- :mod:`metaservice.client`, the wire schemas (``metaservice.*.schemas``),
  :mod:`metaservice.contract` (the snapshot stamp, the barrier grid) and the CLI's
  query commands need the base install only;
- the service itself (``metaservice start``, ``db``, ``token``, ``reconcile``) needs
  ``pip install 'metaservice[server]'``.

Importing this package loads nothing else, so that ``import metaservice.client``
never pulls in the server.

>>> import metaservice
>>> isinstance(metaservice.__version__, str)
True
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("metaservice")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
