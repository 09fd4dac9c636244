"""The change envelope's Spark schema, derived from its Arrow one (`pgcdc.envelope`).

Batches built with `pgcdc.envelope.EnvelopeBuilder` have exactly the Arrow form of this
schema, which is what Spark's Python data sources demand.
"""

from __future__ import annotations

from pyspark.sql.pandas.types import from_arrow_schema

from pgcdc.envelope import ENVELOPE_ARROW_SCHEMA

__all__ = ["ENVELOPE_ARROW_SCHEMA", "ENVELOPE_SCHEMA"]

ENVELOPE_SCHEMA = from_arrow_schema(ENVELOPE_ARROW_SCHEMA)
