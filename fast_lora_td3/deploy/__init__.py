"""The deployment path: exported policies, loading a trained run, the `play` command."""
