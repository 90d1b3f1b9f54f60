"""Task definitions shipped as ``fast_lora_td3.tasks`` (see SPEC §4.4)."""
