"""fast_lora_td3: FastTD3 / FastSAC with SimbaV2-LoRA critics for massively parallel robot learning."""

__version__ = "0.1.0"
