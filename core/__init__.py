"""The shared core: what the converter, the validator and the serving plugins all read with:
the safetensors header parser, the lazy sharded reader, format detection, the tensor model, errors."""
