"""fast_lora_td3.nn."""
