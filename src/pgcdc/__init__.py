"""pgcdc: PostgreSQL logical replication (pgoutput) in Python, into Spark and Delta tables."""

__version__ = "0.1.0"
