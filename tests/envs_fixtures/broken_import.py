"""A module whose own import of a third-party package fails."""

import nonexistent_pkg_for_aitrain_tests  # noqa: F401

from aitrain_grpo.env.base import Environment


class BrokenEnv(Environment):
    pass
