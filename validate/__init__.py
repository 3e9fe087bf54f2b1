"""`dsv4-convert validate` and `plan`: pre-flight checks of FP4 and converted Marlin checkpoints."""
