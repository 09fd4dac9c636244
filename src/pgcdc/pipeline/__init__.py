"""The pipeline's driver side that needs no Spark: what the catalog says of the stream's
relations (`pgcdc.pipeline.columns`)."""

from pgcdc.pipeline.columns import ColumnIdentities, resolve_attnums

__all__ = ["ColumnIdentities", "resolve_attnums"]
