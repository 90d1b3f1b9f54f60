"""Config composition: every command's config is composed by Hydra from typed schemas.

`train` starts from `configs/train.yaml` (presets, groups, overrides); `play` and `export` start
from the config a run saved in its checkpoint and apply their overrides through the same Hydra
composition, so the override grammar, the type checks and the one-line errors are the same.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Mapping, Sequence
from typing import Any

from fast_lora_td3.config.schema import TrainConfig, register_configs
from fast_lora_td3.errors import ConfigError
from fast_lora_td3.fields import field_type, type_name

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
    if importlib.util.find_spec(CONFIG_MODULE) is None:  # configs/ maps into the package on install
        raise ConfigError(
            f"the shipped configs ({CONFIG_MODULE}) are not importable: install the package, "
            "`pip install -e .` from the repository root"
        )
    try:
        if saved is not None:  # typed: a key or value the schema rejects is an error here
            node = OmegaConf.merge(OmegaConf.structured(TrainConfig), saved)
            ConfigStore.instance().store(name=config_name, node=node)
        with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            dcfg = compose(config_name=config_name, overrides=list(overrides))
        reject_unknown_keys(dcfg, TrainConfig, "")  # `+key=` / `++key=` add keys Hydra keeps
        return OmegaConf.to_object(dcfg)
    except ConfigError:
        raise
    except Exception as exc:  # Hydra / OmegaConf parse and validation errors
        raise ConfigError(override_error(exc)) from None


def _valid_keys(schema: type) -> str:
    return ", ".join(f.name for f in dataclasses.fields(schema))


def unknown_key_message(dotted: str) -> str:
    """`unknown key 'algo.nosuch': algo has no such setting; valid keys: …` for a dotted key."""
    schema, prefix = TrainConfig, ""
    *groups, _ = dotted.split(".")
    for name in groups:  # descend while the key's prefix names a nested config group
        names = {f.name for f in dataclasses.fields(schema)}
        tp = field_type(schema, name)[0] if name in names else None
        if not (tp and dataclasses.is_dataclass(tp)):
            break
        schema, prefix = tp, f"{prefix}{name}."
    group = prefix.rstrip(".") or "the root config"
    return f"unknown key {dotted!r}: {group} has no such setting; valid keys: {_valid_keys(schema)}"


def reject_unknown_keys(node: Any, schema: type, prefix: str) -> None:
    """ConfigError on the first key of the composed `node` that `schema` (a config dataclass) does
    not declare: OmegaConf.to_object would drop it, so a misspelt `+key=` would do nothing."""
    names = {f.name: f for f in dataclasses.fields(schema)}
    for key in node:
        dotted = f"{prefix}{key}"
        if key not in names:
            raise ConfigError(unknown_key_message(dotted))
        tp, _ = field_type(schema, key)
        if dataclasses.is_dataclass(tp) and node[key] is not None:
            reject_unknown_keys(node[key], tp, f"{dotted}.")


def override_error(exc: BaseException) -> str:
    """One line for a Hydra / OmegaConf composition error: the key, what would be valid and the
    value given (Hydra's own first line drops the key's type and a group's options)."""
    text = str(exc)
    cause = exc.__cause__
    key = getattr(cause, "full_key", None)
    if key and hasattr(cause, "object_type") and dataclasses.is_dataclass(cause.object_type):
        name = str(getattr(cause, "key", key))
        # Hydra names the override that failed; an earlier one may have set the same key
        failed = re.match(r"Error merging override (.+)", text)
        shown = failed.group(1).lstrip("+").partition("=")[2] if failed else repr(cause.value)
        if name not in {f.name for f in dataclasses.fields(cause.object_type)}:
            return unknown_key_message(key)
        tp, optional = field_type(cause.object_type, name)
        want = type_name(tp) + (" or null" if optional else "")
        return f"{key}={shown} is not valid: use {want} (got {type(cause.value).__name__})"
    if match := re.search(r"Could not find '([^/']+)/([^']*)'", text):
        group, option = match.groups()
        options = [
            line.strip()
            for line in text.split("Available options", 1)[-1]
            .split("Config search path")[0]
            .splitlines()[1:]
            if line.strip() and not line.strip().endswith("_schema")
        ]
        return f"{group}={option} is not valid: use one of {', '.join(options)}"
    if match := re.search(r"Could not (?:override|delete) '([^']+)'", text):
        return unknown_key_message(match.group(1))
    return "bad override: " + " ".join(text.split("\n")[0].split())


def compose_config(overrides: Sequence[str]) -> TrainConfig:
    """Compose configs/train.yaml with `overrides` (Hydra `key=value`, groups, `experiment=`)."""
    return _compose("train", overrides, None)


def compose_run_config(saved: Mapping[str, Any], overrides: Sequence[str]) -> TrainConfig:
    """A saved run's config (the `config` of its checkpoint) with `overrides` applied."""
    return _compose(SAVED_RUN_CONFIG, overrides, saved)
