"""Pure FP4 codecs: tensors in, tensors out. No file I/O, no tensor names, no global state."""
