"""The `pgcdc` command line."""
