"""The off-policy training loop: collector, update step, evaluation, data parallelism."""
