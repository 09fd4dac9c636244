"""`pgcdc run`'s configuration: table entries, the error policy, sizes, and one clear line for
each bad value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.pipeline.config import ConfigError, load_config, parse_config, parse_interval, parse_size

BASE: dict[str, Any] = {
    "source": {"conninfo": "dbname=x", "publication": "p", "slot": "s"},
    "target": {"path": "lake"},
    "tables": {"t": "mirror"},
}


def config(**sections: Any) -> Any:
    return parse_config({**BASE, **sections})


def test_table_entries_and_the_error_policy() -> None:
    parsed = config(
        target={"path": "lake", "on_error": "quarantine"},
        tables={
            "a": "mirror",
            "public.b": ["mirror", "history"],
            "s.c": {"modes": ["history"], "on_error": "stop"},
            "d": {"modes": "changelog"},
        },
    )
    assert parsed.tables == {
        "public.a": ("mirror",),
        "public.b": ("mirror", "history"),
        "s.c": ("history",),
        "public.d": ("changelog",),
    }
    assert parsed.on_error == {
        "public.a": "quarantine",
        "public.b": "quarantine",
        "s.c": "stop",
        "public.d": "quarantine",
    }
    assert config().on_error == {"public.t": "stop"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, 1), ("512", 512), ("64kB", 65536), ("1.5 GB", 1610612736), ("2MB", 2097152)],
)
def test_sizes(value: Any, expected: int) -> None:
    assert parse_size(value, "x") == expected


@pytest.mark.parametrize(
    ("sections", "message"),
    [
        ({"tables": {"t": 5}}, "tables.'t': modes must be among"),
        ({"tables": {"t": ["x"]}}, "tables.'t': modes must be among"),
        ({"tables": {"t": {"modes": []}}}, "tables.'t': modes must be among"),
        (
            {"tables": {"t": ["mirror", "history", "mirror"]}},
            "tables.'t': mode 'mirror' is given twice",
        ),
        ({"tables": {"t": {"mode": "mirror"}}}, "tables.'t': unknown key 'mode'"),
        (
            {"tables": {"t": {"modes": "mirror", "on_error": "skip"}}},
            "tables.'t'.on_error must be one of stop, quarantine",
        ),
        ({"target": {"path": "l", "on_error": 1}}, "target.on_error must be one of"),
        ({"name": ["x"]}, "name must be a word"),
        ({"name": "../x"}, "name must be a word"),
        (
            {"source": {**BASE["source"], "max_retained_wal": "lots"}},
            "source.max_retained_wal must be a size",
        ),
        ({"source": {**BASE["source"], "max_retained_wal": -1}}, "source.max_retained_wal must"),
        ({"trigger": {"interval": "soon"}}, "trigger.interval must be a time"),
        ({"trigger": {"interval": -1}}, "trigger.interval must be a time"),
        ({"trigger": {"max_bytes_per_batch": "big"}}, "trigger.max_bytes_per_batch must be a"),
        ({"target": {"path": "l", "read_cache": "0MB"}}, "target.read_cache must be a size"),
        ({"target": {"path": "s3://b/lake"}}, "target.path s3://b/lake is an object store: give"),
        ({"target": {"path": "l", "state": 3}}, "target.state must be a directory"),
        ({"target": {"path": "l", "storage_options": "x"}}, "[storage_options] must be a table"),
        (
            {"target": {"path": "l", "table_properties": {"targetFileSize": "1"}}},
            "target.table_properties: targetFileSize is not a Delta table property (delta.*)",
        ),
        ({"trigger": {"inline_max_changes": -1}}, "trigger.inline_max_changes must be a whole"),
        ({"trigger": {"apply_processes": -1}}, "trigger.apply_processes must be a whole"),
        ({"trigger": {"apply_processes": "2"}}, "trigger.apply_processes must be a whole"),
        ({"trigger": {"apply_processes": True}}, "trigger.apply_processes must be a whole"),
        ({"source": {**BASE["source"], "spool_dir": ""}}, "source.spool_dir must be a directory"),
        # what a new user types: a misspelt key, a section that does not exist, a string flag
        ({"trigger": {"intervall": 1}}, "unknown key 'intervall' in [trigger]; did you mean 'i"),
        ({"source": {**BASE["source"], "slot_name": "s"}}, "unknown key 'slot_name' in [source]"),
        ({"targets": {"path": "l"}}, "unknown key 'targets' in the top level; did you mean 't"),
        ({"metrics": {"prot": 1}}, "unknown key 'prot' in [metrics]; did you mean 'port'?"),
        ({"snapshot": {"chunks": 1}}, "unknown key 'chunks' in [snapshot]; did you mean"),
        (
            {"source": {**BASE["source"], "create_slot": "false"}},
            "source.create_slot must be true or false (got 'false')",
        ),
        ({"trigger": {"available_now": 1}}, "trigger.available_now must be true or false"),
        ({"snapshot": {"enabled": "no"}}, "snapshot.enabled must be true or false"),
        (
            {"source": {**BASE["source"], "streaming": "yes"}},
            "source.streaming must be one of on, off, parallel (got 'yes')",
        ),
        (
            {"source": {**BASE["source"], "status_interval": "often"}},
            "source.status_interval must be a time",
        ),
        (
            {"spark": {"master": "local[2]", "remote": "sc://h:15002"}},
            "[spark] gives both master and remote: a session is classic (master) or Spark",
        ),
        ({"spark": {"remote": "h:15002"}}, "spark.remote must be a Spark Connect URL such as"),
        ({"spark": {"master": ""}}, 'spark.master must be a master URL such as "local[*]"'),
        ({"spark": {"conf": "x"}}, "[spark.conf] must be a table"),
        ({"spark": {"conf": {"a": [1]}}}, "spark.conf.a must be a string, a number or a bool"),
        ({"spark": {"mastr": "x"}}, "unknown key 'mastr' in [spark]; did you mean 'master'?"),
    ],
)
def test_bad_values_are_one_line(sections: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        config(**sections)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_the_example_configuration_parses() -> None:
    example = load_config(Path(__file__).parents[2] / "examples" / "pipeline.toml")
    assert example.max_retained_wal == 1024**3
    assert example.max_bytes_per_batch == config().max_bytes_per_batch == 64 * 1024**2
    assert set(example.on_error.values()) == {"stop"}
    assert example.read_cache == config().read_cache == 1024**3
    assert config(target={"path": "l", "read_cache": "2GB"}).read_cache == 2 * 1024**3
    assert config(source={**BASE["source"], "max_retained_wal": False}).max_retained_wal is None


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(ConfigError, match=r"p\.toml: not UTF-8 text \(byte 11\)"):
        load_config(path)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0.25, 0.25),
        (2, 2.0),
        ("0.5 seconds", 0.5),
        ("200 ms", 0.2),
        ("1 minute", 60.0),
        ("1s", 1.0),
    ],
)
def test_intervals(value: Any, seconds: float) -> None:
    assert parse_interval(value, "x") == seconds


def test_targets_on_an_object_store(tmp_path: Path) -> None:
    """Target paths join URIs as URIs; the storage options go with every target; the state
    and the spool are local directories, relative to the configuration's, or (the state) a
    URI."""
    parsed = parse_config(
        {
            **BASE,
            "source": {**BASE["source"], "spool_dir": "spool"},
            "target": {
                "path": "s3://bucket/lake/",
                "state": "state",
                "storage_options": {"AWS_REGION": "eu-west-1"},
            },
        },
        tmp_path,
    )
    (target,) = parsed.targets()
    assert target.path == "s3://bucket/lake/public.t"
    assert target.spec.storage_options == {"AWS_REGION": "eu-west-1"}
    assert target.spec.properties is None
    assert parsed.state_path == str(tmp_path / "state")
    assert parsed.spool_dir == str(tmp_path / "spool")
    local = parse_config({**BASE, "target": {"path": "file:///data/lake"}})
    assert local.targets()[0].path == "file:///data/lake/public.t"
    assert local.state_path == "/data/lake/_pgcdc/pipeline"
    remote = parse_config({**BASE, "target": {"path": "az://c/lake", "state": "az://c/state"}})
    assert remote.state_path == "az://c/state"  # a URI, not a path under the config's


def test_table_properties_go_with_every_target() -> None:
    parsed = parse_config(
        {
            **BASE,
            "target": {
                "path": "lake",
                "table_properties": {"delta.deletedFileRetentionDuration": "interval 7 days"},
            },
        }
    )
    (target,) = parsed.targets()
    assert target.spec.properties == {"delta.deletedFileRetentionDuration": "interval 7 days"}


def test_where_spark_runs() -> None:
    """[spark]: local[*] when not given; a master or a Connect server; [spark.conf] as Spark's
    flat keys, quoted or as TOML's dotted keys (nested tables), booleans spelt as Spark's."""
    default = config()
    assert (default.spark_master, default.spark_remote, default.spark_conf) == (None, None, {})
    cluster = config(
        spark={
            "master": "spark://host:7077",
            "conf": {
                "spark.executor.memory": "2g",
                "spark": {"cores": {"max": 4}, "dynamicAllocation": {"enabled": False}},
            },
        }
    )
    assert cluster.spark_master == "spark://host:7077"
    assert cluster.spark_conf == {
        "spark.executor.memory": "2g",
        "spark.cores.max": "4",
        "spark.dynamicAllocation.enabled": "false",
    }
    assert config(spark={"remote": "sc://h:15002/;token=x"}).spark_remote == "sc://h:15002/;token=x"
