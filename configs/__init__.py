"""Hydra configs shipped as ``fast_lora_td3.configs`` (searched via ``pkg://``)."""
