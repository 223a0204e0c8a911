"""Moving data between backends: ``agent-stores copy`` and its Python API.

:class:`Transfer` copies, counts (dry run) or verifies the sessions, memory files and runs
of one KV store into another; see :mod:`agent_stores.transfer.copy` for how it stays
consistent while the source is in use and why a rerun resumes.
"""

from .copy import (
    KINDS,
    KindStats,
    Layout,
    Progress,
    Transfer,
    TransferReport,
    parse_kinds,
    summary_rows,
)
from .rechunk import TooLarge
from .redact import Redactor

__all__ = [
    "KINDS",
    "KindStats",
    "Layout",
    "Progress",
    "Redactor",
    "TooLarge",
    "Transfer",
    "TransferReport",
    "parse_kinds",
    "summary_rows",
]
