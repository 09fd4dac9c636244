"""Pipeline configuration: what `pgcdc run pipeline.toml` reads.

```toml
name = "shop"                      # also the targets' exactly-once application id

[source]
conninfo = "host=db dbname=shop"   # libpq string or URI
publication = "shop_pub"
slot = "shop_slot"
create_slot = true                 # create the slot when missing
streaming = "on"                   # how the server sends large transactions (on/off)
max_retained_wal = "1GB"           # warn when the slot holds back more WAL than this
# spool_dir = "/var/lib/pgcdc"     # where the driver spools changes (default: temp dir)
recover_lost_slot = false          # true: a lost slot is replaced and the targets reconciled
failover = false                   # true: a failover slot (PostgreSQL 17+, synced to a standby)
status_interval = 10               # seconds between status updates to the server (at most)

[snapshot]
enabled = true                     # copy the tables first (first run, added tables)
chunk_blocks = 16384               # blocks (8 kB) per parallel copy task
changelog_reads = true             # a change log starts with the copied rows (op "read")

[target]
path = "lake"                      # <path>/<schema>.<table>[__history|__changelog]
on_error = "stop"                  # a change a table cannot take: "stop" or "quarantine"
read_cache = "1GB"                 # columns of target files kept decoded, per process
# state = "state"                  # the pipeline's own state (default <path>/_pgcdc/<name>)
# [target.storage_options]         # for an object store: delta-rs's options, e.g.
# AWS_REGION = "eu-west-1"         #   path = "s3://bucket/lake", state = "s3://bucket/state"
# [target.table_properties]        # Delta table properties over pgcdc's, e.g.
# "delta.deletedFileRetentionDuration" = "interval 7 days"

[trigger]
available_now = false              # true: catch up, then stop
interval = "0.5 seconds"           # between micro-batches when continuous
max_changes_per_batch = 1000000
max_bytes_per_batch = "64MB"       # of spooled changes (on a cluster: inside Spark's tasks)
inline_max_changes = 100000        # a backlog this small: the driver applies it, not Spark
apply_processes = 2                # the driver's apply processes (0: threads of the driver)

[spark]                            # where the work runs; default: local[*] in this process
master = "local[*]"                # or "spark://host:7077", "yarn", "k8s://https://host:6443"
# remote = "sc://host:15002"       # instead of master: a Spark Connect server
[spark.conf]                       # given to the session as they are
"spark.executor.memory" = "2g"

[metrics]                          # off unless a port is given
port = 9187                        # Prometheus metrics at http://127.0.0.1:9187/metrics

[tables]
"public.customers" = ["mirror", "history"]
"public.orders" = "mirror"
"public.events" = { modes = ["mirror"], on_error = "quarantine" }
"public.metrics" = { modes = ["history"], on_detach = "keep" }  # a partitioned table
```

Paths are relative to the configuration file's directory. The pipeline keeps its state in
``<path>/_pgcdc/<name>/`` (or `state`: a directory, or a URI). Targets on an object store
(``s3://``, ``az://``, ``abfss://``, ``gs://``) take delta-rs's `storage_options`, and so does
a state on one (`pgcdc.storage`); with targets on an object store `state` must be given (a
local directory or a URI: it is never guessed). The spool is the driver's alone: tasks on its
machine (``local[*]``) read it, tasks elsewhere (a cluster's executors, a Spark Connect
server's) get a batch's change bytes inside their work items, and the copy's tasks read
PostgreSQL themselves, so executors share no filesystem with the driver (they need the
targets' storage and the source's conninfo). A Spark task cannot be larger than
``spark.rpc.message.maxSize`` (128 MiB unless set), and the driver's heap holds a few copies
of a batch's bytes while its job starts, so a batch holds at most ``max_bytes_per_batch`` of
spooled changes (whole transactions: a single larger one is a batch of its own, and needs
that setting, and the driver's memory, raised on a cluster).

``[spark]`` says where the work runs: ``master`` for a classic session whose driver is the
``pgcdc run`` process (``local[*]`` by default), or ``remote`` for a Spark Connect server
(not both); ``[spark.conf]`` is given to the session (a key may be quoted,
``"spark.executor.memory" = "2g"``, or written as TOML's dotted keys). Under ``spark-submit``
(`pgcdc.spark.submit`) the session is spark-submit's and ``[spark]`` is not used.
``interval`` is a number of seconds or a text such as ``"0.5 seconds"`` or ``"200 ms"``: at
most one micro-batch starts per interval (a batch starts as soon as changes are there and
the interval since the last one has passed; one that a limit cut short is followed at once
by the next). Batches adapt to the load by themselves: while one is applied the next one's
changes gather, so a batch that takes long is followed by a larger one. While at most
``inline_max_changes`` changes wait, the next batch holds them all and the driver applies it
itself, its targets kept open between batches: in ``apply_processes`` processes of its own
(2; each table pinned to one), or with 0 in threads of its own; a larger backlog goes in
batches of up to ``max_changes_per_batch`` to Spark jobs, one task per table on the
executors.

``read_cache``: the bytes of the targets' files' columns each process (the driver, or each
of its apply processes; each Spark Python worker) keeps decoded between batches, so that the rows a
batch replaces are read back from memory: the unchanged TOAST values of an update, the
versions a history closes. A file whose columns take more than a quarter of it is decoded
again each time.

``on_error``: what happens when a table's targets cannot take a change (a type change the
target cannot follow, a value out of range, a storage error that repeats). ``stop`` (the
default) stops the pipeline with one line naming the table and the change; nothing of the
batch is confirmed, so the slot holds the WAL from there on. ``quarantine`` sets that table
aside instead: its changes keep going, durably, to a change log in the pipeline's state while
the other tables stream on and the slot moves; ``pgcdc recopy PIPELINE.toml TABLE`` then copies
the table anew and applies the logged changes after the copy.
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pgcdc.errors import InvalidConninfo, PgcdcError
from pgcdc.replication.connection import parse_conninfo
from pgcdc.snapshot.plan import DEFAULT_CHUNK_BLOCKS
from pgcdc.storage import is_object_store, join_location
from pgcdc.targets.base import READ_CACHE_BYTES, Mode, TargetSpec

__all__ = ["ConfigError", "PipelineConfig", "TableTarget", "load_config"]

MODES = ("mirror", "history", "changelog")
ON_ERROR = ("stop", "quarantine")
ON_DETACH = ("remove", "keep")
_UNITS = {"": 1, "B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
_SUFFIX = {"mirror": "", "history": "__history", "changelog": "__changelog"}


class ConfigError(PgcdcError):
    """The pipeline configuration is missing something or has a wrong value."""


@dataclass(frozen=True, slots=True)
class TableTarget:
    table: str  # schema.table
    mode: Mode
    path: str
    storage_options: Mapping[str, str] | None = None
    properties: Mapping[str, str] | None = None

    @property
    def spec(self) -> TargetSpec:
        return TargetSpec(
            self.path, self.mode, storage_options=self.storage_options, properties=self.properties
        )


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    name: str
    conninfo: str
    publication: str
    slot: str
    target_path: str
    tables: dict[str, tuple[str, ...]]
    create_slot: bool = False
    snapshot: bool = True
    chunk_blocks: int = DEFAULT_CHUNK_BLOCKS
    #: A change log starts with the copied rows as snapshot reads (op "read"); false: a
    #: table whose targets are all change logs is not copied.
    changelog_reads: bool = True
    streaming: str | None = None
    available_now: bool = False
    interval_seconds: float = 0.5
    max_changes_per_batch: int | None = 1_000_000
    #: At most this many bytes of spooled changes per batch (whole transactions, at least
    #: one): on a cluster a batch's changes travel inside its Spark tasks, which Spark
    #: bounds in size.
    max_bytes_per_batch: int = 64 * 1024**2
    #: While at most this many changes wait, the next batch (all of them) is applied by the
    #: driver itself (its apply processes, the targets kept open), not by a Spark job, whose
    #: tasks open every target anew (`pgcdc.pipeline._batch.batch_bounds`). 0: every batch is a
    #: job.
    inline_max_changes: int = 100_000
    #: The processes that apply the driver's batches, each table pinned to one of them, which
    #: keeps its targets open (`pgcdc.pipeline._appliers`); 0: threads of the driver's own
    #: process do (they share its interpreter with the replication session).
    apply_processes: int = 2
    #: Seconds between standby status updates when nothing else makes one due.
    status_interval: float = 10.0
    #: Per table: "stop" or "quarantine" (see the module docstring).
    on_error: dict[str, str] = field(default_factory=dict)
    #: Per partitioned table: what a detached partition's rows do in its targets, "remove"
    #: (the default: they leave, as in the table) or "keep" (retention by detaching).
    on_detach: dict[str, str] = field(default_factory=dict)
    #: Warn when the slot retains more WAL than this many bytes (None: never).
    max_retained_wal: int | None = 1024**3
    #: When the slot is gone or invalidated while the targets hold data: copy the tables
    #: under a new slot and reconcile the targets with them (else stop with a line).
    recover_lost_slot: bool = False
    #: Create the slot as a failover slot (PostgreSQL 17+: a standby with
    #: sync_replication_slots keeps a copy, so the pipeline goes on after a promotion).
    failover: bool = False
    #: delta-rs storage options of the targets (object stores: credentials, region, ...).
    storage_options: dict[str, str] = field(default_factory=dict)
    #: Delta table properties of the targets, over pgcdc's (`pgcdc.targets.TABLE_PROPERTIES`:
    #: file size, how long removed files and log entries are kept).
    table_properties: dict[str, str] = field(default_factory=dict)
    #: Bytes of target files' columns a process keeps decoded between batches, for the rows
    #: a batch reads back (`pgcdc.targets.decoded_columns`).
    read_cache: int = READ_CACHE_BYTES
    #: Where the pipeline keeps its state (None: beside the targets, when they are local).
    state: str | None = None
    #: Where the driver spools changes for the tasks (None: a temporary directory).
    spool_dir: str | None = None
    #: The Prometheus endpoint ([metrics] port; None: off) and the address it listens on.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: Where Spark runs ([spark]): a classic session's master (None: local[*]) or a Spark
    #: Connect server's URL (remote), never both, and the settings given to the session.
    spark_master: str | None = None
    spark_remote: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)

    @property
    def state_path(self) -> str:
        """Where the pipeline keeps its own state (table OIDs, the initial copy's plan and
        progress, quarantine records, pending change logs): `state`, or beside the targets."""
        if self.state is not None:
            return self.state
        local = self.target_path.removeprefix("file://")
        return str(Path(local) / "_pgcdc" / self.name)

    @property
    def publications(self) -> tuple[str, ...]:
        """`publication`'s names (it may list several, comma-separated)."""
        return tuple(p.strip() for p in self.publication.split(",") if p.strip())

    @property
    def app_id(self) -> str:
        return f"pgcdc:{self.name}"

    def targets(self) -> list[TableTarget]:
        out = []
        options = self.storage_options or None
        properties = self.table_properties or None
        for table, modes in self.tables.items():
            for mode in modes:
                path = target_path(self.target_path, table, mode)
                out.append(TableTarget(table, mode, path, options, properties))  # type: ignore[arg-type]
        return out


def target_path(base: str, table: str, mode: str) -> str:
    """Where the `mode` target of `table` ("schema.table") is in the lake at `base`."""
    return join_location(base, f"{table}{_SUFFIX[mode]}")


#: Every key the configuration knows, per section ("" is the top level): a misspelt key is
#: an error, not a setting silently left at its default.
KEYS = {
    "": ("name", "source", "target", "snapshot", "trigger", "metrics", "spark", "tables"),
    "source": (
        "conninfo",
        "publication",
        "slot",
        "create_slot",
        "streaming",
        "max_retained_wal",
        "spool_dir",
        "recover_lost_slot",
        "failover",
        "status_interval",
    ),
    "snapshot": ("enabled", "chunk_blocks", "changelog_reads"),
    "target": ("path", "on_error", "read_cache", "state", "storage_options", "table_properties"),
    "trigger": (
        "available_now",
        "interval",
        "max_changes_per_batch",
        "max_bytes_per_batch",
        "inline_max_changes",
        "apply_processes",
    ),
    "metrics": ("port", "host"),
    "spark": ("master", "remote", "conf"),
}
STREAMING = ("on", "off", "parallel")


def _check_keys(section: Mapping[str, Any], name: str) -> None:
    known = KEYS[name]
    for key in section:
        if key not in known:
            where = f"[{name}]" if name else "the top level"
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(known)})"
            raise ConfigError(f"unknown key {key!r} in {where}{hint}")


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{name}] must be a table")
    if name in KEYS:
        _check_keys(value, name)
    return value


def _flag(section: dict[str, Any], key: str, where: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key} must be true or false (got {value!r})")
    return value


def _required(section: dict[str, Any], key: str, where: str) -> str:
    value = section.get(key)
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}.{key} is required (a string)")
    return value


def _modes(table: str, value: Any) -> tuple[str, ...]:
    modes = (value,) if isinstance(value, str) else value
    if not isinstance(modes, list | tuple) or not modes:
        modes = ()
    bad = [m for m in modes if m not in MODES]
    if not modes or bad:
        raise ConfigError(
            f"tables.{table!r}: modes must be among {', '.join(MODES)} (got {value!r})"
        )
    twice = sorted({m for m in modes if modes.count(m) > 1})
    if twice:
        raise ConfigError(f"tables.{table!r}: mode {twice[0]!r} is given twice (one target each)")
    return tuple(modes)


def _on_error(value: Any, where: str) -> str:
    if value not in ON_ERROR:
        raise ConfigError(f"{where} must be one of {', '.join(ON_ERROR)} (got {value!r})")
    return str(value)


def _table(name: str, value: Any, default_on_error: str) -> tuple[tuple[str, ...], str, str]:
    """A [tables] entry: a mode, a list of modes, or {modes = [...], on_error = "...",
    on_detach = "..."}: its modes, on_error and on_detach."""
    if not isinstance(value, dict):
        return _modes(name, value), default_on_error, "remove"
    unknown = sorted(set(value) - {"modes", "on_error", "on_detach"})
    if unknown:
        raise ConfigError(
            f"tables.{name!r}: unknown key {unknown[0]!r} (modes, on_error, on_detach)"
        )
    where = f"tables.{name!r}.on_error"
    on_detach = value.get("on_detach", "remove")
    if on_detach not in ON_DETACH:
        raise ConfigError(
            f"tables.{name!r}.on_detach must be one of {', '.join(ON_DETACH)} (got {on_detach!r})"
        )
    on_error = _on_error(value.get("on_error", default_on_error), where)
    return _modes(name, value.get("modes")), on_error, str(on_detach)


def parse_size(value: Any, where: str) -> int:
    """Bytes from an integer or a string such as "512MB" or "1.5 GB"."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        text = value.strip().upper().replace(" ", "")
        number = text.rstrip("KMGTB")
        unit = text[len(number) :]
        try:
            size = float(number) * _UNITS[unit]
        except (ValueError, KeyError):
            size = 0
        if size >= 1:
            return int(size)
    raise ConfigError(f'{where} must be a size such as 1073741824 or "1GB" (got {value!r})')


_SECONDS = {
    "ms": 0.001,
    "millisecond": 0.001,
    "milliseconds": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "min": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
}


def parse_interval(value: Any, where: str) -> float:
    """Seconds from a number or a text such as "0.5 seconds", "200 ms" or "1 minute"."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        number, _, unit = value.strip().partition(" ")
        if not unit:
            digits = number.rstrip("abcdefghijklmnopqrstuvwxyz")
            number, unit = digits, number[len(digits) :] or "s"
        try:
            seconds = float(number) * _SECONDS[unit.strip().lower()]
        except (ValueError, KeyError):
            seconds = -1.0
    else:
        seconds = -1.0
    if not 0 <= seconds < 86400 or seconds != seconds:
        raise ConfigError(
            f'{where} must be a time such as 0.5, "0.5 seconds" or "200 ms" (got {value!r})'
        )
    return seconds


def _optional_path(section: dict[str, Any], key: str, base: Path) -> str | None:
    value = section.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(f"source.{key} must be a directory (a string)")
    return str(base / value)


def _port(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 65535:
        raise ConfigError(f"metrics.port must be a TCP port, 0 to 65535 (got {value!r})")
    return value


def _positive(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{where} must be a positive integer")
    return value


def _count(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigError(f"{where} must be a whole number (0 or more)")
    return value


def _name(value: Any) -> str:
    if not isinstance(value, str) or not value or not value.replace("-", "_").isidentifier():
        raise ConfigError(
            f"name must be a word of letters, digits, _ and - (got {value!r}); it names the "
            "pipeline's state directory and the targets' application id"
        )
    return value


def _conninfo(value: str) -> str:
    try:
        parse_conninfo(value)
    except InvalidConninfo as exc:
        raise ConfigError(f"source.conninfo: {exc}") from None
    return value


def _spark_settings(section: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """[spark.conf] as Spark's flat keys: TOML's dotted keys (``spark.executor.memory =
    "2g"`` unquoted) arrive as nested tables; booleans are written as Spark spells them."""
    flat: dict[str, str] = {}
    for key, value in section.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_spark_settings(value, f"{name}."))
        elif isinstance(value, bool):
            flat[name] = "true" if value else "false"
        elif isinstance(value, str | int | float):
            flat[name] = str(value)
        else:
            raise ConfigError(f"spark.conf.{name} must be a string, a number or a boolean")
    return flat


def _spark(section: dict[str, Any]) -> tuple[str | None, str | None, dict[str, str]]:
    """[spark]: master, remote (never both) and the conf."""
    master, remote = section.get("master"), section.get("remote")
    if master is not None and remote is not None:
        raise ConfigError(
            "[spark] gives both master and remote: a session is classic (master) or Spark "
            "Connect (remote), not both"
        )
    if master is not None and (not isinstance(master, str) or not master):
        raise ConfigError(f'spark.master must be a master URL such as "local[*]" (got {master!r})')
    if remote is not None and (not isinstance(remote, str) or not remote.startswith("sc://")):
        raise ConfigError(
            f'spark.remote must be a Spark Connect URL such as "sc://host:15002" (got {remote!r})'
        )
    conf = section.get("conf", {})
    if not isinstance(conf, dict):
        raise ConfigError("[spark.conf] must be a table")
    return master, remote, _spark_settings(conf)


def parse_config(data: dict[str, Any], base: Path = Path()) -> PipelineConfig:
    _check_keys(data, "")
    source = _section(data, "source")
    target = _section(data, "target")
    trigger = _section(data, "trigger")
    tables = _section(data, "tables")
    snapshot = _section(data, "snapshot")
    metrics = _section(data, "metrics")
    spark_master, spark_remote, spark_conf = _spark(_section(data, "spark"))
    if not tables:
        raise ConfigError('[tables] must name at least one table, e.g. "public.t" = "mirror"')
    default_on_error = _on_error(target.get("on_error", "stop"), "target.on_error")
    parsed_tables = {}
    on_error = {}
    on_detach = {}
    for name, value in tables.items():
        qualified = name if "." in name else f"public.{name}"
        modes, on_error[qualified], on_detach[qualified] = _table(name, value, default_on_error)
        parsed_tables[qualified] = modes
    max_wal = source.get("max_retained_wal", 1024**3)
    given_path = _required(target, "path", "target")
    target_path = given_path if "://" in given_path else str(base / given_path)
    state = target.get("state")
    if state is not None and (not isinstance(state, str) or not state):
        raise ConfigError("target.state must be a directory (a string)")
    if state is None and is_object_store(given_path):
        raise ConfigError(
            f"target.path {given_path} is an object store: give target.state, where the "
            "pipeline keeps its state: a local directory or a URI on the store (e.g. "
            f"{join_location(given_path, '_pgcdc/' + str(data.get('name', 'pipeline')))})"
        )
    storage = _section(target, "storage_options")
    properties = _section(target, "table_properties")
    for key in properties:
        if not str(key).startswith("delta."):
            raise ConfigError(
                f"target.table_properties: {key} is not a Delta table property (delta.*)"
            )
    streaming = source.get("streaming")
    if streaming is not None and streaming not in STREAMING:
        raise ConfigError(
            f"source.streaming must be one of {', '.join(STREAMING)} (got {streaming!r})"
        )
    max_changes = trigger.get("max_changes_per_batch", 1_000_000)
    if max_changes is not None:
        max_changes = _positive(max_changes, "trigger.max_changes_per_batch")
    return PipelineConfig(
        name=_name(data.get("name", "pipeline")),
        conninfo=_conninfo(_required(source, "conninfo", "source")),
        publication=_required(source, "publication", "source"),
        slot=_required(source, "slot", "source"),
        target_path=target_path,
        tables=parsed_tables,
        create_slot=_flag(source, "create_slot", "source", False),
        recover_lost_slot=_flag(source, "recover_lost_slot", "source", False),
        failover=_flag(source, "failover", "source", False),
        snapshot=_flag(snapshot, "enabled", "snapshot", True),
        changelog_reads=_flag(snapshot, "changelog_reads", "snapshot", True),
        chunk_blocks=_positive(
            snapshot.get("chunk_blocks", DEFAULT_CHUNK_BLOCKS), "snapshot.chunk_blocks"
        ),
        streaming=streaming,
        available_now=_flag(trigger, "available_now", "trigger", False),
        interval_seconds=parse_interval(trigger.get("interval", 0.5), "trigger.interval"),
        max_changes_per_batch=max_changes,
        max_bytes_per_batch=parse_size(
            trigger.get("max_bytes_per_batch", 64 * 1024**2), "trigger.max_bytes_per_batch"
        ),
        inline_max_changes=_count(
            trigger.get("inline_max_changes", 100_000), "trigger.inline_max_changes"
        ),
        apply_processes=_count(trigger.get("apply_processes", 2), "trigger.apply_processes"),
        status_interval=parse_interval(source.get("status_interval", 10), "source.status_interval"),
        on_error=on_error,
        on_detach=on_detach,
        max_retained_wal=None
        if max_wal is False
        else parse_size(max_wal, "source.max_retained_wal"),
        storage_options={str(k): str(v) for k, v in storage.items()},
        table_properties={str(k): str(v) for k, v in properties.items()},
        read_cache=parse_size(target.get("read_cache", READ_CACHE_BYTES), "target.read_cache"),
        state=None if state is None else state if "://" in state else str(base / state),
        spool_dir=_optional_path(source, "spool_dir", base),
        metrics_port=None if metrics.get("port") is None else _port(metrics["port"]),
        metrics_host=str(metrics.get("host", "127.0.0.1")),
        spark_master=spark_master,
        spark_remote=spark_remote,
        spark_conf=spark_conf,
    )


def load_config(path: str | Path) -> PipelineConfig:
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return parse_config(data, path.parent)
