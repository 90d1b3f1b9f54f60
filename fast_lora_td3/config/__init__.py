"""Configuration: the typed schema, Hydra composition, validation and the CPU defaults."""
