"""The launch planner behind `dsv4-convert plan`: how many GPUs, which TP/EP split, the launch line."""
