"""Shared test set-up: tiny networks run fastest single-threaded on the 2-core CI machine."""

import os

import pytest
import torch

os.environ.setdefault("MUJOCO_GL", "egl")


@pytest.fixture(autouse=True)
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
