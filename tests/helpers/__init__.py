"""Test helpers, imported as `tests.helpers.<module>` (tests/ is a package; pytest puts the clone's
root on sys.path because tests/__init__.py exists, so no test touches sys.path itself):

- compare: assert_bytes_equal, the byte-exact comparison
- cli: run the real CLI in a subprocess; tree hashes of an output
- ckpt_factory: small hand-built checkpoints of every source format
- padded_ref: the independent reference of a padded (--tp/--ep) conversion
- engine_stacks: the engines' own conversion chains, as the golden cases were made
- checks: one validate check run on in-memory or on-disk tensors
- corrupt, catalogue: the catalogue of corrupted inputs (tests/reliability)
- fuzz_targets: the parsers under fuzzing (tests/reliability, benchmarks/fuzz_parsers.py)
- cli_batch: a script that runs many CLI commands in one process
"""
