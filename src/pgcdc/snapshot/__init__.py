"""A consistent initial copy of tables, handed off to the change stream."""
