"""A module that raises while it is being imported."""

raise RuntimeError("database not reachable:\nretry later")
