"""Reading a checkpoint from disk: the safetensors header parser, the index, the tensor model and reader, where a source is."""
