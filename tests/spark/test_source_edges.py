"""The pipeline equals its source wherever the stream can tell (issue 21): a focused case per
class that once lost or changed data silently, or stopped the pipeline for good."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.embedded import Database
from replication.helpers import unique
from spark.helpers import assert_identical, pipeline_config, run_pipeline

pytestmark = pytest.mark.server


def _publication(db: Database, tables: str) -> tuple[str, str]:
    slot, publication = unique("edge"), unique("pub")
    db.execute(f"CREATE PUBLICATION {publication} FOR TABLE {tables}")
    return slot, publication


def _config(db: Database, tmp_path: Path, tables: dict[str, Any], **source: Any) -> dict[str, Any]:
    slot, publication = _publication(db, ", ".join(t.split(".")[-1] for t in tables))
    config = pipeline_config(db, slot, publication, tmp_path / "lake", tables)
    config["source"].update({"create_slot": True, **source})
    return config


def test_tables_sharing_user_defined_types(spark: Any, pg: Database, tmp_path: Path) -> None:
    """Two tables share an enum, one has a second one; later a column of a third enum is
    added to one of them, and an enum column to the other: each batch's tasks type the
    values from the descriptions the driver read (the driver's lookups and the tasks'
    registries once disagreed: "'NoneType' object has no attribute 'query'", for good)."""
    pg.execute(
        "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');"
        "CREATE TYPE color AS ENUM ('red', 'green');"
        "CREATE TABLE a (id int PRIMARY KEY, m mood);"
        "CREATE TABLE b (id int PRIMARY KEY, m mood, c color, cs color[]);"
        "INSERT INTO a VALUES (1, 'ok'); INSERT INTO b VALUES (1, 'sad', 'red', '{red}')"
    )
    tables = {"public.a": ["mirror", "history"], "public.b": ["mirror", "history"]}
    config = _config(pg, tmp_path, tables)
    run_pipeline(spark, config)
    pg.execute(
        "INSERT INTO a VALUES (2, 'happy');"
        "INSERT INTO b VALUES (2, 'ok', 'green', '{green,red}')"
    )
    run_pipeline(spark, config)
    pg.execute(
        "CREATE TYPE size AS ENUM ('s', 'm', 'l');"
        "ALTER TABLE b ADD COLUMN z size DEFAULT 'm';"
        "ALTER TABLE a ADD COLUMN c color;"
        "INSERT INTO a VALUES (3, 'sad', 'green'); UPDATE a SET c = 'red' WHERE id = 1;"
        "INSERT INTO b VALUES (3, 'happy', 'red', NULL, 'l'); UPDATE b SET z = 's' WHERE id = 1"
    )
    run_pipeline(spark, config)
    assert_identical(pg, config)
