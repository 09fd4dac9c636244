"""Integration tests of pgcdc.replication and the CLI against real PostgreSQL servers.

A package (this file) so that module names such as ``test_options`` and ``test_errors`` do not
clash with the modules of the same name in tests/unit and tests/protocol.
"""
