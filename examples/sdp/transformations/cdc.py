"""The pipeline's graph: one flow from the ``pgoutput`` source (a slot's committed changes)
into the ``pgcdc`` sink, which applies every table of the publication to its targets under
the lake: ``<lake>/<schema>.<table>`` (mirror), ``...__history``, ``...__changelog``.

``spark-pipelines`` runs this file with ``spark`` defined. Settings come from the
environment: PGCDC_CONNINFO (a libpq conninfo or URI) and PGCDC_PUBLICATION are required;
PGCDC_SLOT (default ``pgcdc_sdp``, created when missing), PGCDC_LAKE (default ``lake`` beside
this project) and PGCDC_MODES (default ``mirror,history,changelog``) are not.
"""

import os
from pathlib import Path

from pyspark import pipelines as dp

from pgcdc.spark import sdp

PROJECT = Path(__file__).resolve().parents[1]
CONNINFO = os.environ["PGCDC_CONNINFO"]

sdp.register(spark)  # noqa: F821 -- given by spark-pipelines

dp.create_sink(
    "lake",
    format="pgcdc",
    options={
        "path": os.environ.get("PGCDC_LAKE", str(PROJECT / "lake")),
        "conninfo": CONNINFO,
        "modes": os.environ.get("PGCDC_MODES", "mirror,history,changelog"),
        "name": "sdp-example",
    },
)


@dp.append_flow(target="lake")
def changes():  # type: ignore[no-untyped-def]
    return (
        spark.readStream.format("pgoutput")  # noqa: F821
        .option("conninfo", CONNINFO)
        .option("publication", os.environ["PGCDC_PUBLICATION"])
        .option("slot", os.environ.get("PGCDC_SLOT", "pgcdc_sdp"))
        .option("createSlot", "true")
        .load()
    )
