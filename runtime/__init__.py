"""Run-time shared by the converter, marlin-to-source, synth and the validator: executors, the output path
(runtime/output/: OUT's one owner, from the command line to publish), hashes and the manifest, the shard
writer's direct I/O, memory and profiling."""
