"""The Spark tests' local session, for the initial copy's tests."""

from spark.conftest import spark

__all__ = ["spark"]
