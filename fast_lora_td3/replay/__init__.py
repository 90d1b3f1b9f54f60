"""The GPU-resident replay buffer and its checkpoint state."""
