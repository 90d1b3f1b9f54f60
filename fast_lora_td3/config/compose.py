"""Config composition: every command's config is composed by Hydra from typed schemas.

`train` starts from `configs/train.yaml` (presets, groups, overrides); `play` and `export` start
from the config a run saved in its checkpoint and apply their overrides through the same Hydra
composition, so the override grammar, the type checks and the one-line errors are the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fast_lora_td3.config.schema import TrainConfig, register_configs
from fast_lora_td3.errors import ConfigError

__all__ = ["compose_config", "compose_run_config"]

CONFIG_MODULE = "fast_lora_td3.configs"
"""The package of the shipped YAML configs (configs/ in the repository)."""
SAVED_RUN_CONFIG = "_saved_run"
"""ConfigStore name under which a checkpoint's config is composed (no YAML file has it)."""


def _compose(config_name: str, overrides: Sequence[str], saved: Mapping[str, Any] | None) -> Any:
    """Compose `config_name` (a saved run's config first stored under it) with `overrides`; Hydra
    and OmegaConf errors become one ConfigError line."""
    from hydra import compose, initialize_config_module
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    register_configs()
    GlobalHydra.instance().clear()
    try:
        if saved is not None:  # typed: a key or value the schema rejects is an error here
            node = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)
            ConfigStore.instance().store(name=config_name, node=node)
        with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            dcfg = compose(config_name=config_name, overrides=list(overrides))
        return OmegaConf.to_object(dcfg)
    except ConfigError:
        raise
    except Exception as exc:  # Hydra / OmegaConf parse and validation errors
        msg = " ".join(str(exc).split("\n")[0].split())
        raise ConfigError(f"bad override: {msg}") from None


def compose_config(overrides: Sequence[str]) -> TrainConfig:
    """Compose configs/train.yaml with `overrides` (Hydra `key=value`, groups, `experiment=`)."""
    return _compose("train", overrides, None)


def compose_run_config(saved: Mapping[str, Any], overrides: Sequence[str]) -> TrainConfig:
    """A saved run's config (the `config` of its checkpoint) with `overrides` applied."""
    return _compose(SAVED_RUN_CONFIG, overrides, saved)
