"""The one home of every file and directory name dsv4-convert reads or writes. Converter, staging,
publish, marlin-to-source, validate, synth and the path-safety rules all name files through these."""

__all__ = [
    "CONFIG", "HF_QUANT_CONFIG", "RESTORED_XATTR", "INDEX_FILE", "LOCK", "LOST", "LOST_SUFFIX", "MANIFEST", "MARKER", "PROGRESS",
    "RECORDS", "REPLACED", "RUN_PREFIX", "SERVING_NOTES", "SINGLE_FILE", "SOURCE_DIR", "SOURCE_HEADERS", "STAGING_SUFFIX",
    "SYNTH_MANIFEST", "TMP_SUFFIX", "reserved_input_names", "staging_entry_ok", "MTP_FILE", "shard_name",
]

# A Hugging Face checkpoint's own files (read in the source, rewritten in the output)
CONFIG = "config.json"
HF_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt's
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"  # an unsharded checkpoint
MTP_FILE = "mtp.safetensors"  # GLM-4.6 / 4.7 FP4: the MTP layer, outside the index (core/sources/families.py's GLM entry)


def shard_name(i: int, n: int) -> str:
    """File name of shard i (0-based) of n, as Hugging Face names them: model-00001-of-00003.safetensors."""
    return f"model-{i + 1:05d}-of-{n:05d}.safetensors"


# What dsv4-convert adds to a converted checkpoint
SERVING_NOTES = "SERVING.md"  # how to serve it (convert/serving_notes.py)
MANIFEST = "dsv4-convert.manifest.json"  # written last: every file with its hash (runtime/manifest.py)
SOURCE_DIR = "dsv4-convert-source"  # the originals needed to give the input back byte for byte
SOURCE_HEADERS = "headers.json"  # in SOURCE_DIR: each source shard's safetensors header text
LOST = "lost_scales.safetensors"  # in SOURCE_DIR: scale bytes the target clamped, for an exact reverse

# Staging (`<OUT>.partial/`, runtime/output/tree.py): never in a published directory
STAGING_SUFFIX = ".partial"
PROGRESS = "dsv4-convert.progress.json"  # fingerprint + finished shards, for --resume
LOCK = "dsv4-convert.lock"  # keeps two runs apart
LOST_SUFFIX = ".lost.safetensors"  # per shard, merged into LOST at the end
REPLACED = ".replaced-"  # publish moves an OUT it replaces into a fresh `<OUT>.replaced-XXXX`, then deletes it
TMP_SUFFIX = ".tmp"  # every file is written as `<name>.tmp`, then renamed
RUN_PREFIX = ".run-"  # the workers' scratch directory in staging (runtime/jobs.py RunDir)

# Other outputs
MARKER = "dsv4-convert.marker.json"  # older marlin-to-source outputs' "dsv4-convert wrote this directory"
# marlin-to-source's record now: an extended attribute of the output directory, so that the rebuilt
# checkpoint holds exactly the source's files (runtime/output/rules.py mark_restored)
RESTORED_XATTR = "user.dsv4-convert.restored"
SYNTH_MANIFEST = "synth.json"  # a synthetic checkpoint's record of how it was made

RECORDS = (MANIFEST, MARKER, SYNTH_MANIFEST)  # a directory holding one of these was written by dsv4-convert

# Names a run writes at the top of its staging directory, whatever the input holds. An input file
# of one of these names would be overwritten or deleted by the tool's own: refused at plan time.
_TOOL_WRITES = frozenset({LOCK, PROGRESS, MANIFEST, MARKER, SERVING_NOTES, SOURCE_DIR})
_CONVERTED_RECORDS = frozenset({MANIFEST, SERVING_NOTES, SOURCE_DIR})  # what marlin-to-source reads back


def reserved_input_names(names, *, converted: bool = False) -> list[str]:
    """The top-level input names that collide with a file the tool writes: its lock, progress record,
    manifest, marker, SERVING.md, source record, any `*.tmp`, `*.lost.safetensors` or `.run-*`.
    `converted`: the input is a converted checkpoint (marlin-to-source), whose manifest, SERVING.md
    and source record are what it reads."""
    allowed = _CONVERTED_RECORDS if converted else frozenset()
    return sorted(n for n in names if n not in allowed and (
        n in _TOOL_WRITES or n.endswith(TMP_SUFFIX) or n.endswith(LOST_SUFFIX) or n.startswith(RUN_PREFIX)))


def staging_entry_ok(name: str, source_names: set[str]) -> bool:
    """Whether a run of this tool can have made `name` at the top of its staging directory: its own
    files, a shard, a temporary, its scratch directory, or a copy of one of the input's top-level names."""
    return (name in _TOOL_WRITES or name in source_names or name in (CONFIG, HF_QUANT_CONFIG, INDEX_FILE)
            or name.endswith((".safetensors", TMP_SUFFIX)) or name.startswith(RUN_PREFIX))
