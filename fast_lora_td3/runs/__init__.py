"""A run's files on disk: checkpoints, metrics and logs, plots, videos, atomic writes."""
