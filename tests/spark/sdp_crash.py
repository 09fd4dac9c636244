"""A pipeline definition file the SDP test adds to a copy of examples/sdp for one run: the
``pgcdc`` sink as the example declares it, except that once its commit is done (the targets
hold the batch, with their watermarks) it kills the Spark Connect server's JVM, before Spark
records the batch as committed. The next run replays the batch; the targets skip it.

The crash happens when the file ``PGCDC_SDP_CRASH`` names exists (it is removed, and
``<it>.done`` written, first). Definition files load in any order: this one registers its
sink now and also replaces ``register_sink`` for a ``sdp.register`` that comes after it.
"""

import os
import signal
from pathlib import Path

import pgcdc.spark.sink as sink_module
from pgcdc.spark.sink import PgcdcSink, PgcdcStreamWriter, SinkOptions

MARKER = os.environ["PGCDC_SDP_CRASH"]


def _jvm() -> int:
    """The java process this Python worker descends from (the Connect server)."""
    pid = os.getppid()
    while pid > 1:
        if Path(f"/proc/{pid}/exe").resolve().name == "java":
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no java ancestor")


class CrashingWriter(PgcdcStreamWriter):
    def commit(self, messages, batchId):  # type: ignore[no-untyped-def]
        super().commit(messages, batchId)
        if os.path.exists(MARKER):
            os.unlink(MARKER)
            Path(MARKER + ".done").write_text(str(batchId))
            os.kill(_jvm(), signal.SIGKILL)


class CrashingSink(PgcdcSink):
    def streamWriter(self, schema, overwrite):  # type: ignore[no-untyped-def]
        return CrashingWriter(SinkOptions.parse(self.options))


def register_crashing(spark):  # type: ignore[no-untyped-def]
    spark.dataSource.register(CrashingSink)


sink_module.register_sink = register_crashing
register_crashing(spark)  # noqa: F821 -- given by spark-pipelines
