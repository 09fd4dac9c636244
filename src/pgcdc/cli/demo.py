"""`pgcdc demo`: an embedded PostgreSQL, a small workload, and its changes decoded."""

from __future__ import annotations

import click

from pgcdc.cli.render import message_text
from pgcdc.embedded import EmbeddedServer
from pgcdc.protocol import StreamingMode
from pgcdc.replication import ReplicationClient, ReplicationConnection, StreamOptions, end_lsn_of

SCHEMA = """
CREATE TABLE customers (
    id bigint PRIMARY KEY, name text NOT NULL, email text, tags text[],
    profile jsonb, balance numeric(12, 2), created_at timestamptz DEFAULT now()
);
CREATE TABLE orders (
    id bigint PRIMARY KEY, customer_id bigint REFERENCES customers, total numeric(12, 2),
    notes text
);
ALTER TABLE orders REPLICA IDENTITY FULL;
CREATE PUBLICATION demo_pub FOR TABLE customers, orders;
"""

WORKLOAD = [
    """INSERT INTO customers (id, name, email, tags, profile, balance) VALUES
       (1, 'Ada', 'ada@example.com', '{vip,early}', '{"city": "London"}', 120.50),
       (2, 'Grace', NULL, '{}', '{"city": "Arlington", "navy": true}', 0)""",
    "INSERT INTO orders VALUES (10, 1, 99.90, repeat('long note ', 500)), (11, 2, 5, NULL)",
    "UPDATE customers SET balance = balance - 99.90 WHERE id = 1",
    "UPDATE orders SET total = 6 WHERE id = 11",
    "DELETE FROM orders WHERE id = 11",
    "SELECT pg_logical_emit_message(false, 'demo', 'a message outside any transaction')",
    "TRUNCATE orders",
]


def run_demo() -> None:
    click.secho("Starting an embedded PostgreSQL ...", fg="cyan", err=True)
    with EmbeddedServer() as server:
        db = server.create_database("demo")
        click.secho(
            f"PostgreSQL {server.version_string} on port {server.port}; "
            "creating tables, publication and slot",
            fg="cyan",
            err=True,
        )
        db.execute(SCHEMA)
        with ReplicationConnection.connect(db.dsn) as conn:
            slot = conn.create_slot("demo_slot")
        with db.connect() as sql:
            for statement in WORKLOAD:
                click.secho(f"SQL> {' '.join(statement.split())[:100]}", fg="yellow")
                sql.execute(statement)
        options = StreamOptions(
            ("demo_pub",),
            messages=True,
            streaming=StreamingMode.ON if server.version >= 14 else StreamingMode.OFF,
        )
        click.secho(
            f"\nDecoded pgoutput stream from slot demo_slot (from {slot.consistent_point}):",
            fg="cyan",
        )
        with ReplicationClient(db.dsn, "demo_slot", options, until_idle=True) as client:
            for frame, message in client:
                assert client.stream is not None
                click.echo(message_text(message, frame.data_start, client.stream.decoder.relations))
                end = end_lsn_of(message)
                if end is not None:
                    client.confirm(end)
        ((confirmed,),) = db.execute(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = 'demo_slot'"
        )
        click.secho(f"\nSlot confirmed up to {confirmed}. Done.", fg="green", err=True)
