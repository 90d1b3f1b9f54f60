"""The backend table: ``env.backend`` name → where its adapter lives and what it needs installed.

Adding a backend touches this one file (a row of ``BACKEND_TABLE``, or ``register_backend`` from
outside the package) plus its adapter module and a ``configs/env/<name>.yaml``. The adapter is a
class built as ``cls(cfg: EnvConfig)`` whose static ``task_ids()`` lists its task ids. Nothing
here imports an adapter or a simulator; the table sits below ``envs.config`` and ``envs.factory``
so that both can read it.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BackendSpec:
    """Where a backend lives and what it needs installed."""

    module: str
    """Importable module that defines the backend class (imported only when the env is built)."""
    cls: str
    """Name of the ``VecEnv`` class in ``module``: ``cls(cfg)`` builds it; ``cls.task_ids()``
    lists its task ids, or returns None when the backend checks the id itself once its simulator
    runs (Isaac Lab's registry exists only after the app started)."""
    package: str
    """Package the backend needs, checked with ``importlib.util.find_spec`` before building."""
    install_hint: str
    """Command that installs ``package``, shown when it is missing."""


BACKEND_TABLE: dict[str, BackendSpec] = {
    "mjlab": BackendSpec(
        "fast_lora_td3.envs.mjlab_env", "MjlabVecEnv", "mjlab", "pip install mjlab"
    ),
    "isaaclab": BackendSpec(
        "fast_lora_td3.envs.isaaclab_env",
        "IsaacLabVecEnv",
        "isaaclab",
        'pip install "isaaclab[isaacsim,all]==2.3.2.post1" --extra-index-url https://pypi.nvidia.com '
        "(on an NVIDIA GPU machine, with OMNI_KIT_ACCEPT_EULA=YES)",
    ),
    "gymnasium": BackendSpec(
        "fast_lora_td3.envs.gym_env", "GymVecEnv", "gymnasium", "pip install gymnasium"
    ),
    "dummy": BackendSpec("fast_lora_td3.envs.dummy", "PointMassEnv", "torch", "pip install torch"),
}
"""``env.backend`` → its spec; the keys are the valid backends, in the order errors list them."""


def register_backend(name: str, spec: BackendSpec) -> None:
    """Make ``env.backend=<name>`` build ``spec`` (a backend outside this package, or a test's).

    Re-registering a name replaces its spec.
    """
    if not name or not isinstance(spec, BackendSpec):
        raise TypeError(f"register_backend({name!r}, {spec!r}): needs a name and a BackendSpec")
    BACKEND_TABLE[name] = spec


def backend_names() -> list[str]:
    """The valid values of ``env.backend``."""
    return list(BACKEND_TABLE)
