"""What dsv4-convert recorded, verified: the manifest of a converted checkpoint lists every file it
wrote (shards, configs, index, dsv4-convert-source/) with its size and hash; each mismatch is a finding."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ...core.files import MANIFEST
from ...runtime.manifest import verify
from ..check import Finding, Scope, Severity, check
from ..inputs import CheckpointInput, Options

__all__ = ["manifest_verifies"]


def _verifying(c: CheckpointInput, opts: Options) -> bool:
    return opts.verify_manifest


@check(id="integrity.manifest", severity=Severity.ERROR, scope=Scope.CHECKPOINT,
       hint="convert again from the source (a changed file is corrupt or was edited); "
            "--no-verify-manifest skips this check",
       needs=(_verifying, "--no-verify-manifest"))
def manifest_verifies(c: CheckpointInput, opts: Options) -> Iterator[Finding]:
    """A converted file that no longer matches its recorded hash serves, or restores, different bytes."""
    mismatches = verify(Path(c.root), MANIFEST)
    if mismatches is None:
        if c.checkpoint is not None and c.checkpoint.format.converted:
            yield Finding(MANIFEST, "a converted checkpoint without its manifest: nothing it holds can be "
                          "verified.", file=MANIFEST, cause="missing")
        return
    for m in mismatches:
        yield Finding(m.file, f"{m.problem}: {m.detail}.", file=m.file, cause=m.problem)
