"""User-facing errors: one clear line naming the setting and what would be valid."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user mistake in configuration or input; the CLI prints it as one line and exits 2."""


class CheckpointError(ConfigError):
    """A missing, corrupt or incompatible checkpoint."""


class NonFiniteError(RuntimeError):
    """A NaN/Inf was found in a named tensor at a given step (raised under `nan_action=stop`)."""

    def __init__(self, name: str, step: int) -> None:
        super().__init__(f"non-finite values in '{name}' at env step {step}")
        self.name = name
        self.step = step
