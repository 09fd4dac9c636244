"""The pipeline behind ``pgcdc run``: a slot's changes applied, batch by batch, to Delta
targets, exactly once, after an initial copy; its driver needs no Spark itself and runs its
work on Spark (`pgcdc.spark`).

* `Pipeline` runs a `PipelineConfig` (`load_config` reads ``pipeline.toml``);
* `verify` compares targets with their source tables row by row;
* the rooms inside: the driver's loop (`_driver`), the start-up decision and its table
  (`_startup`) with the slot's lineage (`_lineage`), tables followed by OID (`_tables`) and
  what the stream does not show (`_bindings`), column identity (`_columns`), quarantine
  records (`_quarantine`), the initial copy (`_copy`) and copies beside the stream
  (`_online`), a batch applied (`_batch`) and the work it is cut into (`_work`), where that
  work runs (`_dispatch`: Spark's tasks; `_appliers`: the driver's apply processes).
"""

from pgcdc.pipeline._bindings import BindingError
from pgcdc.pipeline._copy import InitialCopy, TableProgress
from pgcdc.pipeline._driver import (
    BatchReport,
    Pipeline,
    PipelineFailed,
    PipelineStats,
    SlotLost,
    check_storage,
    request_recopy,
)
from pgcdc.pipeline._quarantine import Quarantine
from pgcdc.pipeline.config import (
    ConfigError,
    PipelineConfig,
    TableTarget,
    load_config,
    parse_config,
)
from pgcdc.pipeline.verify import Verdict, compare_history, compare_mirror, source_rows

__all__ = [
    "BatchReport",
    "BindingError",
    "ConfigError",
    "InitialCopy",
    "Pipeline",
    "PipelineConfig",
    "PipelineFailed",
    "PipelineStats",
    "Quarantine",
    "SlotLost",
    "TableProgress",
    "TableTarget",
    "Verdict",
    "check_storage",
    "compare_history",
    "compare_mirror",
    "load_config",
    "parse_config",
    "request_recopy",
    "source_rows",
]
