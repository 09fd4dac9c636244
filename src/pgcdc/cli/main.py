"""The `pgcdc` command. Flags follow pg_recvlogical's where they overlap.

Exit status: 0 on success; 1 for every error pgcdc diagnoses (one line on stderr,
``pgcdc: error: ...``); 2 for a command line that is wrong (unknown, missing or malformed
option), also one line; 130 after Ctrl-C. Tracebacks are for bugs only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import click

from pgcdc import __version__
from pgcdc.capture import CaptureReader
from pgcdc.cli.render import message_json, message_text
from pgcdc.decoding import PluginRunner
from pgcdc.errors import OutputFileError, PgcdcError, PluginError, SlotExists
from pgcdc.extras import require, require_extra
from pgcdc.monitoring.units import format_bytes
from pgcdc.output_file import OutputFile
from pgcdc.protocol import (
    INVALID_LSN,
    Decoder,
    Lsn,
    PrimaryKeepalive,
    StreamingMode,
    XLogData,
    parse_frame,
)
from pgcdc.replication import publications, slots
from pgcdc.replication.acknowledgement import end_lsn_of
from pgcdc.replication.client import ReplicationClient, RetryState
from pgcdc.replication.connection import ReplicationConnection
from pgcdc.replication.options import OriginFilter, StreamOptions
from pgcdc.replication.record import record as record_capture

__all__ = ["main"]

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class Terminal:
    """pgcdc's stderr: whole lines, and on a terminal one line shown in place (the live
    status, the state of a reconnect) that a whole line first clears."""

    def __init__(self) -> None:
        self.in_place = False

    @property
    def interactive(self) -> bool:
        return sys.stderr.isatty()

    def show(self, text: str) -> None:
        if not self.interactive:
            return
        sys.stderr.write(f"\r{text}\x1b[K")
        sys.stderr.flush()
        self.in_place = True

    def say(self, line: str) -> None:
        if self.in_place:
            sys.stderr.write("\r\x1b[K")
            self.in_place = False
        sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def end(self) -> None:
        """Keep the line shown in place (the last status) as it is."""
        if self.in_place:
            sys.stderr.write("\n")
            self.in_place = False


TERMINAL = Terminal()


class _LogToTerminal(logging.Handler):
    """pgcdc's warnings (a lost connection, a reconnect) as ``pgcdc: ...`` lines."""

    def emit(self, record: logging.LogRecord) -> None:
        TERMINAL.say(f"pgcdc: {record.getMessage()}")


def _fail(message: str, code: int = EXIT_FAILURE) -> None:
    TERMINAL.say(f"pgcdc: error: {_one_line(message)}")
    sys.exit(code)


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in text.strip().splitlines() if part.strip())


def _user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn pgcdc's own errors into one line on stderr, and Ctrl-C into a quiet exit."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PgcdcError as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            TERMINAL.say("pgcdc: interrupted")
            sys.exit(EXIT_INTERRUPTED)
        except BrokenPipeError:
            sys.stderr.close()
            sys.exit(141)

    return wrapper


class LsnType(click.ParamType):
    name = "LSN"

    def convert(self, value: Any, param: Any, ctx: Any) -> Lsn:
        if isinstance(value, Lsn):
            return value
        try:
            return Lsn.parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


LSN = LsnType()


class SecondsType(click.ParamType):
    """A finite number of seconds; above 0, or also 0 with `zero_ok`."""

    name = "SECONDS"

    def __init__(self, *, zero_ok: bool = False) -> None:
        self.zero_ok = zero_ok

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not self.zero_ok):
            least = "0 or more" if self.zero_ok else "above 0"
            self.fail(f"{value!r} is not a finite number of seconds {least}", param, ctx)
        return seconds


_conninfo_option = click.option(
    "-d",
    "--dbname",
    "conninfo",
    default="",
    metavar="CONNINFO",
    help="libpq connection string or URI (PG* environment variables apply)",
)


def _stream_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The connection and stream flags shared by `tail` and `record`."""
    decorators = [
        _conninfo_option,
        click.option("-S", "--slot", required=True, help="replication slot name"),
        click.option(
            "--publication",
            "publications",
            multiple=True,
            required=True,
            help="publication name (repeat for several)",
        ),
        click.option("--create-slot", is_flag=True, help="create the slot first"),
        click.option("--if-not-exists", is_flag=True, help="with --create-slot: reuse a slot"),
        click.option("-I", "--startpos", type=LSN, default=None, help="start position X/Y"),
        click.option(
            "-E",
            "--endpos",
            type=LSN,
            default=None,
            help="stop once a transaction ending at or after X/Y was received",
        ),
        click.option(
            "--until-idle",
            is_flag=True,
            help="stop once caught up with the server's WAL position at start",
        ),
        click.option(
            "--proto-version",
            type=click.IntRange(1, 4),
            default=None,
            help="pgoutput proto_version (default: the server's highest)",
        ),
        click.option("--binary", is_flag=True, help="binary tuple values"),
        click.option("--messages", is_flag=True, help="include logical decoding messages"),
        click.option(
            "--streaming",
            type=click.Choice(["off", "on", "parallel"]),
            default=None,
            help="stream large in-progress transactions (default: off; with -P, on when the "
            "plugin has streaming callbacks)",
        ),
        click.option("--two-phase", is_flag=True, help="decode prepared transactions"),
        click.option(
            "--origin",
            type=click.Choice(["any", "none"]),
            default=None,
            help="none: only changes made locally (PG16+)",
        ),
        click.option(
            "-s",
            "--status-interval",
            type=SecondsType(),
            default=10.0,
            show_default=True,
            help="seconds between status updates to the server",
        ),
    ]
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


def _options_from(kwargs: dict[str, Any]) -> StreamOptions:
    return StreamOptions(
        publication_names=tuple(kwargs["publications"]),
        proto_version=kwargs["proto_version"],
        binary=kwargs["binary"],
        messages=kwargs["messages"],
        streaming=StreamingMode(kwargs["streaming"] or "off"),
        two_phase=kwargs["two_phase"],
        origin=OriginFilter(kwargs["origin"]) if kwargs["origin"] else None,
    )


def _check_stream_flags(kwargs: dict[str, Any]) -> None:
    """Usage errors of the stream flags, found before anything is created."""
    if kwargs["endpos"] is not None and kwargs["until_idle"]:
        raise click.UsageError("--endpos and --until-idle cannot be combined")


def _maybe_create_slot(kwargs: dict[str, Any]) -> bool:
    """Create the slot when asked; True if this run created it."""
    if not kwargs["create_slot"]:
        return False
    with ReplicationConnection.connect(kwargs["conninfo"]) as conn:
        try:
            created = conn.create_slot(kwargs["slot"], two_phase=kwargs["two_phase"])
        except SlotExists:
            if not kwargs["if_not_exists"]:
                raise
            return False
        TERMINAL.say(f"pgcdc: created slot {created.slot_name} at {created.consistent_point}")
        return True


def _show_retry(state: RetryState) -> None:
    """The state of a reconnect, in place (the loss itself was said once, as a line)."""
    limit = "" if state.gives_up_in is None else f", giving up in {state.gives_up_in:.0f} s"
    TERMINAL.show(
        f"pgcdc: reconnecting: down for {state.down_for:.0f} s, attempt {state.attempts}, "
        f"next in {state.next_in:.1f} s{limit}: {state.error}"
    )


def _position_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Where the stream starts and stops, and how often it reports: a client's arguments."""
    return {
        "start_lsn": kwargs["startpos"] or INVALID_LSN,
        "endpos": kwargs["endpos"],
        "until_idle": kwargs["until_idle"],
        "status_interval": kwargs["status_interval"],
    }


def _client(kwargs: dict[str, Any], **extra: Any) -> ReplicationClient:
    return ReplicationClient(
        kwargs["conninfo"],
        kwargs["slot"],
        _options_from(kwargs),
        **_position_arguments(kwargs),
        **extra,
    )


class TransactionOutput:
    """What `tail` writes. With `hold`, a transaction's output reaches the output only once
    the transaction is complete (`commit`): one cut off by a lost connection is sent again
    whole by the next session, and is then written once (`discard` drops the part). Held
    output stays in memory up to `memory_limit` bytes, the rest in a temporary file. A file
    (`-f`) is made durable (`sync`: one fsync; see `pgcdc.output_file` for devices and pipes)
    before each status update that may move the slot, not after every transaction."""

    def __init__(
        self, file: OutputFile | None, *, hold: bool, memory_limit: int, spill_dir: str | None
    ) -> None:
        #: The file given with -f; None for standard output.
        self.file = file
        self.out: BinaryIO = sys.stdout.buffer if file is None else file.file
        self.held: tempfile.SpooledTemporaryFile[bytes] | None = None
        if hold:
            self.held = tempfile.SpooledTemporaryFile(  # noqa: SIM115 (closed by close())
                max_size=memory_limit, dir=spill_dir
            )

    def write(self, data: bytes) -> None:
        with self._reporting():
            (self.out if self.held is None else self.held).write(data)

    def commit(self) -> None:
        """Everything written so far is complete: write it out (`sync` makes it durable)."""
        with self._reporting():
            if self.held is not None and self.held.tell():
                self.held.seek(0)
                shutil.copyfileobj(self.held, self.out)
                self.discard()
            self.out.flush()

    def sync(self) -> None:
        """Make what was committed durable (before the slot is confirmed past it)."""
        if self.file is not None:
            self.file.sync()

    def _reporting(self) -> contextlib.AbstractContextManager[None]:
        """Output that cannot be written (disk full, ...) as one line; a closed pipe as it
        is (the reader went away: a quiet exit)."""
        if self.file is not None:
            return self.file.reporting()
        return _stdout_reporting()

    def discard(self) -> None:
        """Drop what is held: the transaction it belongs to did not complete."""
        if self.held is not None:
            self.held.seek(0)
            self.held.truncate()

    def close(self) -> None:
        if self.held is not None:
            self.held.close()
        if self.file is not None:
            self.file.close()


@contextlib.contextmanager
def _stdout_reporting() -> Iterator[None]:
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputFileError(f"cannot write standard output: {exc.strerror}") from None


class StatusLine:
    """A one-line live status (rate, lag in bytes) on a terminal's stderr."""

    def __init__(self) -> None:
        self.count = 0
        self.started = self.shown = time.monotonic()

    def update(self, client: ReplicationClient) -> None:
        self.count += 1
        now = time.monotonic()
        if not TERMINAL.interactive or now - self.shown < 0.5:
            return
        self.shown = now
        acks = client.acks
        rate = self.count / max(now - self.started, 1e-9)
        flush = acks.flush_lsn
        lag = acks.keepalive_wal_end - flush if acks.keepalive_wal_end else 0
        TERMINAL.show(
            f"{self.count:>10} messages {rate:>9.0f}/s  received {acks.received}  "
            f"confirmed {flush}  lag {max(lag, 0)} bytes"
        )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pgcdc")
def cli() -> None:
    """pgcdc: PostgreSQL logical replication (pgoutput) in Python."""


def _plugin_option(value: str) -> tuple[str, str | None]:
    name, sep, arg = value.partition("=")
    if not name:
        raise click.BadParameter(f"expected NAME=VALUE or NAME, got {value!r}")
    return name, arg if sep else None


_SIZE_UNITS = {"": 1, "kb": 1 << 10, "mb": 1 << 20, "gb": 1 << 30}


def _size(value: str) -> int:
    text = value.strip().lower().replace(" ", "")
    digits = text.rstrip("kmgb")
    unit = text[len(digits) :]
    if not digits.isdigit() or unit not in _SIZE_UNITS:
        raise click.BadParameter(f"expected a size such as 64MB, got {value!r}")
    return int(digits) * _SIZE_UNITS[unit]


@cli.command()
@_stream_options
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option(
    "-P",
    "--plugin",
    default=None,
    metavar="PLUGIN",
    help="pgcdc output plugin: test_decoding, wal2json, json or module:Class",
)
@click.option(
    "-o",
    "--option",
    "plugin_options",
    multiple=True,
    metavar="NAME[=VALUE]",
    help="option passed to the output plugin (repeatable)",
)
@click.option(
    "--memory-limit",
    default="64MB",
    show_default=True,
    help="memory for a transaction's output held back until it commits (with -P, as much "
    "again for the transactions the plugin waits for) before it spills to disk",
)
@click.option(
    "--spill-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="where held-back output and transactions spill (default: the temp directory)",
)
@click.option(
    "-f",
    "--file",
    "output",
    type=click.Path(dir_okay=False, allow_dash=True),
    default="-",
    help="write here instead of standard output",
)
@click.option("--no-confirm", is_flag=True, help="do not move the slot (leave changes in it)")
@click.option(
    "--reconnect-timeout",
    type=SecondsType(zero_ok=True),
    default=300.0,
    show_default=True,
    help="after a lost connection, give up when the server is still unreachable after this "
    "long (0: do not reconnect)",
)
@_user_errors
def tail(
    fmt: str,
    plugin: str | None,
    plugin_options: tuple[str, ...],
    memory_limit: str,
    spill_dir: str | None,
    output: str,
    no_confirm: bool,
    reconnect_timeout: float,
    **kwargs: Any,
) -> None:
    """Stream decoded messages from a slot, one per line (with -P: the plugin's output).

    A transaction is written once it is complete, unless --streaming asks for its parts as
    they arrive."""
    if plugin is None and plugin_options:
        raise click.UsageError("-o/--option needs -P/--plugin")
    _check_stream_flags(kwargs)
    options = dict(_plugin_option(o) for o in plugin_options)
    limit = _size(memory_limit)
    out = TransactionOutput(
        None if output == "-" else OutputFile(output),
        hold=kwargs["streaming"] is None or kwargs["streaming"] == "off",
        memory_limit=limit,
        spill_dir=spill_dir,
    )
    client_options: dict[str, Any] = {
        "acknowledge": not no_confirm,
        "reconnect": reconnect_timeout > 0,
        "reconnect_timeout": reconnect_timeout,
        "on_retry": _show_retry,
        "on_session": lambda _stream: out.discard(),
        "before_status": out.sync,
    }
    try:
        created = _maybe_create_slot(kwargs)
        if plugin is not None:
            _tail_plugin(plugin, options, limit, spill_dir, out, created, client_options, kwargs)
        else:
            _tail_messages(fmt, out, client_options, kwargs)
    finally:
        out.close()


def _tail_messages(
    fmt: str, out: TransactionOutput, client_options: dict[str, Any], kwargs: dict[str, Any]
) -> None:
    client = _client(kwargs, **client_options)
    status = StatusLine()
    render = message_json if fmt == "json" else message_text
    with client:
        for frame, message in client:
            assert client.stream is not None
            relations = client.stream.decoder.relations
            line = render(message, frame.data_start, relations)
            text = json.dumps(line, ensure_ascii=False) if fmt == "json" else line
            out.write(f"{text}\n".encode())
            end = end_lsn_of(message)
            if end is not None:
                out.commit()
                client.confirm(end)
            status.update(client)


def _tail_plugin(
    plugin: str,
    options: dict[str, str | None],
    memory_limit: int,
    spill_dir: str | None,
    out: TransactionOutput,
    is_init: bool,
    client_options: dict[str, Any],
    kwargs: dict[str, Any],
) -> None:
    """Run an output plugin; its output is made durable before its position is confirmed."""
    runner = PluginRunner(
        kwargs["conninfo"],
        kwargs["slot"],
        plugin,
        _options_from(kwargs),
        plugin_options=options,
        sink=lambda write: out.write(write.data + b"\n"),
        on_durable=out.commit,
        is_init=is_init,
        memory_limit=memory_limit,
        spill_dir=spill_dir,
        streaming=kwargs["streaming"],
        **_position_arguments(kwargs),
        **client_options,
    )
    try:
        runner.run()
    except PgcdcError:
        raise
    except Exception as exc:  # a bug in the plugin: one line, as for any other error
        where = runner.ctx.write_location
        at = f" at LSN {where}" if where else ""
        raise PluginError(
            f"output plugin {plugin!r} failed{at}: {type(exc).__name__}: {exc} "
            "(nothing after the last transaction it finished was confirmed)"
        ) from exc


@cli.command()
@_stream_options
@click.option(
    "-f",
    "--file",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="capture file to write",
)
@click.option("--no-confirm", is_flag=True, help="do not move the slot")
@_user_errors
def record(output: Path, no_confirm: bool, **kwargs: Any) -> None:
    """Record a slot's raw replication frames into a capture file."""
    _check_stream_flags(kwargs)
    existed = output.exists()
    capture = OutputFile(output)  # writable? (a file that existed is left as it was)
    try:
        with capture:
            _maybe_create_slot(kwargs)
            client = _client(kwargs, reconnect=False, acknowledge=not no_confirm)
            count = record_capture(client, capture)
    except BaseException:
        if not existed and output.exists() and output.stat().st_size == 0:
            output.unlink()  # nothing was recorded: leave no empty capture behind
        raise
    TERMINAL.say(f"pgcdc: recorded {count} messages to {output}")


@cli.command()
@click.argument("capture", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text")
@click.option("--keepalives", is_flag=True, help="also print keepalive frames")
@_user_errors
def decode(capture: Path, fmt: str, keepalives: bool) -> None:
    """Print every message of a capture file, one per line."""
    with open(capture, "rb") as file:
        reader = CaptureReader(file, str(capture))
        header = reader.header
        decoder = Decoder(header.proto_version, header.streaming)
        for record in reader:
            try:
                frame = parse_frame(record.frame)
                message = None
                if isinstance(frame, XLogData):
                    message = decoder.decode(frame.payload, frame.data_start)
            except PgcdcError as exc:
                raise PgcdcError(f"{capture}: record {record.index}: {exc}") from None
            if isinstance(frame, PrimaryKeepalive):
                if keepalives:
                    item = {
                        "type": "Keepalive",
                        "wal_end": str(frame.wal_end),
                        "reply_requested": frame.reply_requested,
                    }
                    click.echo(
                        json.dumps(item)
                        if fmt == "json"
                        else f"{frame.wal_end!s:>17} Keepalive reply_requested="
                        f"{str(frame.reply_requested).lower()}"
                    )
                continue
            if message is None or not isinstance(frame, XLogData):
                continue
            if fmt == "json":
                line = message_json(message, frame.data_start, decoder.relations)
                click.echo(json.dumps(line, ensure_ascii=False))
            else:
                click.echo(message_text(message, frame.data_start, decoder.relations))


@cli.group()
def slot() -> None:
    """Create, drop and list replication slots."""


@slot.command("create")
@click.argument("name")
@_conninfo_option
@click.option("--two-phase", is_flag=True, help="enable decoding of prepared transactions")
@click.option("--failover", is_flag=True, help="synchronize to standbys (PostgreSQL 17+)")
@click.option("--if-not-exists", is_flag=True, help="succeed if the slot already exists")
@_user_errors
def slot_create(
    name: str, conninfo: str, two_phase: bool, failover: bool, if_not_exists: bool
) -> None:
    """Create a logical slot for pgoutput."""
    try:
        created = slots.create_slot(conninfo, name, two_phase=two_phase, failover=failover)
    except SlotExists:
        if not if_not_exists:
            raise
        click.echo(f"slot {name} already exists")
        return
    click.echo(f"created slot {created.slot_name} at {created.consistent_point}")


@slot.command("drop")
@click.argument("name")
@_conninfo_option
@click.option("--wait", is_flag=True, help="wait for an active consumer to let go")
@_user_errors
def slot_drop(name: str, conninfo: str, wait: bool) -> None:
    """Drop a slot (the WAL it retained is released)."""
    slots.drop_slot(conninfo, name, wait=wait)
    click.echo(f"dropped slot {name}")


@slot.command("list")
@_conninfo_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table")
@_user_errors
def slot_list(conninfo: str, fmt: str) -> None:
    """List slots with their health: activity, positions, WAL retained, invalidation."""
    found = slots.list_slots(conninfo)
    if fmt == "json":
        for info in found:
            click.echo(
                json.dumps(
                    {f.name: _jsonable(getattr(info, f.name)) for f in dataclasses.fields(info)}
                )
            )
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        "slot",
        "plugin",
        "database",
        "active pid",
        "restart_lsn",
        "confirmed_flush_lsn",
        "WAL retained",
        "wal_status",
        "safe_wal_size",
        "invalidated",
    )
    for info in found:
        table.add_row(
            info.slot_name,
            info.plugin or "",
            info.database or "",
            str(info.active_pid or ""),
            str(info.restart_lsn or ""),
            str(info.confirmed_flush_lsn or ""),
            format_bytes(info.retained_bytes),
            info.wal_status or "",
            format_bytes(info.safe_wal_size),
            info.invalidation_reason or ("yes" if info.invalidated else ""),
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def _jsonable(value: Any) -> Any:
    return (
        value
        if value is None or (isinstance(value, bool | int | float) and not isinstance(value, Lsn))
        else str(value)
    )


@cli.command()
@click.argument(
    "pipeline",
    required=False,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@_conninfo_option
@click.option("-S", "--slot", "slot_name", default=None, help="replication slot name")
@click.option(
    "--standby",
    metavar="CONNINFO",
    default=None,
    help="a physical standby: show the failover slot's copy there (PostgreSQL 17+)",
)
@click.option(
    "--max-retained-wal",
    metavar="SIZE",
    default=None,
    callback=lambda _ctx, _param, value: None if value is None else _size(value),
    help="warn when the slot retains more WAL than this, e.g. 10GB",
)
@click.option(
    "--batches",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    metavar="BATCHLOG",
    help="the pipeline's batch log (its state's batches/ directory): its lag and throughput",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    metavar="FILE.png",
    help="with --batches: draw lag and throughput over time into FILE.png",
)
@click.option("--json", "as_json", is_flag=True, help="one JSON object, for monitoring systems")
@_user_errors
def status(
    pipeline: Path | None,
    conninfo: str,
    slot_name: str | None,
    standby: str | None,
    max_retained_wal: int | None,
    batches: Path | None,
    plot: Path | None,
    as_json: bool,
) -> None:
    """Show a pipeline's health (PIPELINE.toml: its slot, lag and throughput, every target's
    watermark and rows, the initial copy, stopped tables) or a slot's (-S SLOT: positions,
    lag, retained WAL, what endangers it, its failover copy; with a batch log, a pipeline's
    lag and throughput), and --plot them."""
    from pgcdc.cli.status import pipeline_sections, print_sections, status_sections

    if pipeline is not None:
        if slot_name is not None or batches is not None:
            raise click.UsageError("give PIPELINE.toml, or -S SLOT (and --batches), not both")
        require("pgcdc.pipeline", "spark")
        print_sections(pipeline_sections(pipeline, plot=plot), as_json=as_json)
        return
    if slot_name is None:
        raise click.UsageError("give PIPELINE.toml or -S SLOT")
    if plot is not None and batches is None:
        raise click.UsageError("--plot needs --batches BATCHLOG (or PIPELINE.toml)")
    sections = status_sections(
        conninfo,
        slot_name,
        standby=standby,
        max_retained_bytes=max_retained_wal,
        batch_log=batches,
        plot=plot,
    )
    print_sections(sections, as_json=as_json)


@cli.group()
def publication() -> None:
    """Create, alter and describe publications."""


_tables_option = click.option(
    "-t",
    "--table",
    "tables",
    multiple=True,
    metavar="SPEC",
    help="table to publish: name, 'name(col, col)', optionally ' WHERE expr' (repeatable)",
)


_force_option = click.option(
    "--force",
    is_flag=True,
    help="do it even if the server would then refuse the application's UPDATE or DELETE of a "
    "table (its replica identity cannot carry the change)",
)


def _print_publication(info: publications.PublicationInfo) -> None:
    count = len(info.tables)
    scope = "all tables" if info.all_tables else f"{count} table{'' if count == 1 else 's'}"
    click.echo(
        f"publication {info.name}: {scope}; publishes {', '.join(info.publishes)}"
        f"{'; via partition root' if info.via_partition_root else ''}"
    )
    for t in info.tables:
        cols = f" ({', '.join(t.columns)})" if t.columns else ""
        where = f" WHERE {t.row_filter}" if t.row_filter else ""
        click.echo(f"  {t.schema}.{t.name}{cols}{where}  replica identity {t.replica_identity}")
    for warning in info.warnings():
        click.secho(f"warning: {warning}", fg="yellow", err=True)


@publication.command("create")
@click.argument("name")
@_conninfo_option
@_tables_option
@click.option("--all-tables", is_flag=True, help="FOR ALL TABLES")
@click.option("--publish", default=None, help="operations, e.g. 'insert,update,delete,truncate'")
@click.option("--via-partition-root", is_flag=True, help="publish partitions as their root")
@_force_option
@_user_errors
def publication_create(
    name: str,
    conninfo: str,
    tables: tuple[str, ...],
    all_tables: bool,
    publish: str | None,
    via_partition_root: bool,
    force: bool,
) -> None:
    """Create a publication (refused if it would make the application's UPDATE or DELETE of
    a table fail, unless --force)."""
    if all_tables == bool(tables):
        raise click.UsageError("give either --all-tables or at least one --table")
    info = publications.create_publication(
        conninfo,
        name,
        None if all_tables else [publications.TableSpec.parse(t) for t in tables],
        publish=publish.split(",") if publish else None,
        via_partition_root=via_partition_root,
        force=force,
    )
    _print_publication(info)


@publication.command("alter")
@click.argument("name")
@_conninfo_option
@click.option("--add", multiple=True, metavar="SPEC", help="table to add (repeatable)")
@click.option("--drop", multiple=True, metavar="TABLE", help="table to drop (repeatable)")
@_force_option
@_user_errors
def publication_alter(
    name: str, conninfo: str, add: tuple[str, ...], drop: tuple[str, ...], force: bool
) -> None:
    """Drop tables from a publication and add tables to it, in one transaction (--drop T --add
    'T(cols)' changes T's column list; refused like create, unless --force)."""
    info = publications.alter_publication(
        conninfo,
        name,
        add=[publications.TableSpec.parse(t) for t in add],
        drop=drop,
        force=force,
    )
    _print_publication(info)


@publication.command("describe")
@click.argument("name")
@_conninfo_option
@_user_errors
def publication_describe(name: str, conninfo: str) -> None:
    """Show a publication's tables, and warn about those whose UPDATE or DELETE the server
    refuses now."""
    _print_publication(publications.describe_publication(conninfo, name))


@cli.command()
@click.argument("pipeline", type=click.Path(exists=True, dir_okay=False))
@_user_errors
def run(pipeline: str) -> None:
    """Run a pipeline (PIPELINE.toml): a slot's changes into Delta mirror/history tables."""
    run_pipeline = require("pgcdc.cli.run", "spark").run_pipeline
    from pgcdc.pipeline import check_storage, load_config

    # Before anything starts (Spark, a slot): the targets' root and the state can be used
    # (a writable directory; an object store that answers).
    check_storage(load_config(pipeline))
    run_pipeline(pipeline)


@cli.command()
@click.argument("pipeline", type=click.Path(exists=True, dir_okay=False))
@click.argument("table")
@_user_errors
def recopy(pipeline: str, table: str) -> None:
    """Copy TABLE of a stopped pipeline anew (after a quarantine): its targets are removed;
    the next `pgcdc run` copies it while the other tables stream, then applies the changes
    logged since."""
    require("pgcdc.pipeline", "spark")
    from pgcdc.pipeline import load_config, request_recopy

    removed = request_recopy(load_config(pipeline), table)
    click.echo(f"removed {', '.join(removed)}; the next `pgcdc run` copies {table} again")


@cli.command()
@click.argument("pipeline", type=click.Path(exists=True, dir_okay=False))
@click.argument("tables", nargs=-1)
@_user_errors
def verify(pipeline: str, tables: tuple[str, ...]) -> None:
    """Compare every mirror and history target of PIPELINE.toml (or of TABLES) with its
    source table, row by row: one line per target, exit status 1 when one differs. Run it
    when the pipeline has caught up (changes not yet applied are differences too); it reads
    whole tables."""
    require("pgcdc.pipeline", "spark")
    from pgcdc.pipeline import load_config
    from pgcdc.pipeline.verify import compare_history, compare_mirror
    from pgcdc.targets import open_target

    config = load_config(pipeline)
    wanted = {t if "." in t else f"public.{t}" for t in tables}
    unknown = sorted(wanted - set(config.tables))
    if unknown:
        raise PgcdcError(f"{unknown[0]} is not a table of pipeline {config.name!r}")
    different = 0
    for spec in config.targets():
        if spec.mode == "changelog" or (wanted and spec.table not in wanted):
            continue
        target = open_target(spec.spec, app_id=config.app_id, source=spec.table)
        rows = target.to_arrow() if target.exists else None
        compare = compare_history if spec.mode == "history" else compare_mirror
        verdict = compare(config.conninfo, spec.table, rows, publications=config.publications)
        different += not verdict.equal
        click.echo(f"{spec.mode:8} {verdict}")
        for row in (verdict.missing + verdict.extra)[:3]:
            click.echo(f"         e.g. {'missing' if row in verdict.missing else 'extra'}: {row}")
    if different:
        raise SystemExit(1)


@cli.command()
@_user_errors
def demo() -> None:
    """The full demo: embedded PostgreSQL, a workload, the pipeline into Delta, a verdict."""
    require_extra("spark", "pgcdc demo")
    require("pgcdc.cli.demo", "spark").run_demo()


def _usage_line(exc: click.UsageError) -> str:
    where = exc.ctx.command_path if exc.ctx is not None else "pgcdc"
    return f"{exc.format_message()} (see '{where} --help')"


def main() -> None:
    """The entry point: the exit statuses of the module's docstring, one line per error."""
    log = logging.getLogger("pgcdc")
    if not log.handlers:
        log.addHandler(_LogToTerminal(logging.WARNING))
        log.propagate = False
    try:
        code = cli.main(prog_name="pgcdc", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:  # `pgcdc` or `pgcdc slot` alone
        click.echo(exc.format_message(), err=True)
        code = EXIT_USAGE
    except click.UsageError as exc:
        _fail(_usage_line(exc), EXIT_USAGE)
    except click.ClickException as exc:
        _fail(exc.format_message(), exc.exit_code)
    except click.Abort:  # Ctrl-C outside a command's own handling
        TERMINAL.say("pgcdc: interrupted")
        code = EXIT_INTERRUPTED
    TERMINAL.end()
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
