"""The converted checkpoint's record: its quantization_config, parsed strictly and rendered in one place."""
