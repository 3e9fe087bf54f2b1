"""`dsv4-convert validate`: pre-flight checks of FP4 and converted Marlin checkpoints (the launch planner,
`plan`, is planner/launch.py)."""
