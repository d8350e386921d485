"""A module importing a name that its (existing) source module does not have."""

from json import no_such_function  # noqa: F401
