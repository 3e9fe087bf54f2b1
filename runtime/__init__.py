"""Run-time shared by the converter and the validator: executors, staging and publishing records,
hashes, the shard writer's direct I/O, paths, memory and profiling."""
