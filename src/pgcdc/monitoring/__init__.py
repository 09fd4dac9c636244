"""Operations figures: a slot's health and the warnings before the server invalidates it
(`slot_status`, `wal_warnings`) or a failover loses it (`failover_warnings`); the pipeline's
batch log (`BatchLog`), its plot (`plot_batches`) and its Prometheus endpoint
(`PipelineMetrics`).

No Spark, no targets: matplotlib and prometheus-client are imported only when a plot or an
endpoint is made.
"""

from pgcdc.monitoring.batch_log import BATCH_LOG, BatchLog, BatchRecord
from pgcdc.monitoring.lag import LAG_FILE, LagReport, current_lag, read_lag, write_lag
from pgcdc.monitoring.metrics import PipelineMetrics
from pgcdc.monitoring.plot import plot_batches, throughput
from pgcdc.monitoring.slot_status import (
    SlotStatus,
    StandbyCopy,
    failover_warnings,
    slot_status,
    wal_warnings,
)
from pgcdc.monitoring.units import format_bytes, format_seconds

__all__ = [
    "BATCH_LOG",
    "LAG_FILE",
    "LagReport",
    "current_lag",
    "read_lag",
    "write_lag",
    "BatchLog",
    "BatchRecord",
    "PipelineMetrics",
    "SlotStatus",
    "StandbyCopy",
    "failover_warnings",
    "format_bytes",
    "format_seconds",
    "plot_batches",
    "slot_status",
    "throughput",
    "wal_warnings",
]
