"""Running pgoutput streams in tests: availableNow queries that collect their micro-batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pgcdc.embedded import Database


def source_options(db: Database, slot: str, publication: str, **extra: Any) -> dict[str, str]:
    options = {"conninfo": db.dsn, "slot": slot, "publication": publication, "statusInterval": "1"}
    options.update({k: str(v) for k, v in extra.items()})
    return options


def collect_stream(
    spark: Any, options: dict[str, str], checkpoint: Path, *, fail_on: int | None = None
) -> list[tuple[int, list[Any]]]:
    """Run the stream to the server's current position; (batch id, rows in sequence order) per
    micro-batch. With `fail_on`, that batch raises after being collected (a crash)."""
    batches: list[tuple[int, list[Any]]] = []

    def each(df: Any, batch_id: int) -> None:
        rows = sorted(df.collect(), key=lambda r: (r.commit_lsn, r.ordinal))
        batches.append((batch_id, rows))
        if batch_id == fail_on:
            raise RuntimeError(f"injected failure in batch {batch_id}")

    query = (
        spark.readStream.format("pgoutput")
        .options(**options)
        .load()
        .writeStream.foreachBatch(each)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return batches
