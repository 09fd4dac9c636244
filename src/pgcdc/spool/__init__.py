"""The spool: committed transactions on disk, as the server sent them, per relation, and the
replication session that fills it (`Spooler`). The pipeline's driver plans batches over it;
whoever applies a batch reads its byte ranges (`read_changes`, `read_envelope`)."""

from pgcdc.spool._session import Spooler, SpoolWriter
from pgcdc.spool._spool import (
    MESSAGES,
    BatchInfo,
    Spool,
    SpoolRange,
    default_spool_dir,
    read_changes,
    read_envelope,
)

__all__ = [
    "MESSAGES",
    "BatchInfo",
    "Spool",
    "SpoolRange",
    "SpoolWriter",
    "Spooler",
    "default_spool_dir",
    "read_changes",
    "read_envelope",
]
