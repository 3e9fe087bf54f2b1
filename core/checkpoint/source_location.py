"""Where a source checkpoint is: a local directory (or its model.safetensors), or a Hugging Face repo id fetched
into (or found in) the local hub cache, with what a download fetches and which folders no engine reads.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import InputError, UsageError
from ..files import CONFIG, INDEX_FILE, SINGLE_FILE
from .index import read_weight_map

__all__ = ["HUB_PATTERNS", "LEFT_OUT_DIRS", "hub_cache_dir", "is_download_metadata", "resolve_source"]

# What a hub download fetches: configs, weights, index, tokenizer and docs; never other artefacts.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.md", "*.txt", "*.model", "*.tiktoken", "*.py", "*.jinja"]
# Folders no engine reads: `original/` (the release's own-format copy; vLLM 0.33 downloads with
# ignore_patterns ["original/**/*"]) and gpt-oss's `metal/` (Apple Metal weights). Never fetched, never copied.
LEFT_OUT_DIRS = ("original", "metal")
HUB_IGNORE = [f"{d}/*" for d in LEFT_OUT_DIRS]  # fnmatch: `*` crosses `/`, so this is the whole tree
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


# `hf download --local-dir` keeps its own bookkeeping (locks, metadata) in IN/.cache/huggingface/:
# not part of the checkpoint, never copied, and free to change while a run reads IN
_DOWNLOAD_METADATA = (".cache", "huggingface")


def is_download_metadata(rel: Path) -> bool:
    """Whether `rel` (relative to the checkpoint root) is the downloader's bookkeeping, not the checkpoint."""
    return Path(rel).parts[:2] == _DOWNLOAD_METADATA


def resolve_source(source: str | Path) -> Path:
    """A local checkpoint directory (or its `model.safetensors`), or a Hugging Face repo id
    (`org/name`, fetched or found in the local cache; honours HF_HUB_OFFLINE and HF_HOME)."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.is_file():
        if path.name == SINGLE_FILE:
            return path.resolve().parent
        raise UsageError(f"{path} is a file; dsv4-convert reads a checkpoint directory",
                         error_id="source.not_a_directory", file=str(path),
                         hint=f"pass the directory that holds config.json and the shards ({path.parent})")
    text = str(source)
    if not _REPO_ID.match(text) or text.startswith((".", "~")):
        raise InputError(f"{text} does not exist and is not a Hugging Face repo id (org/name)",
                         error_id="source.not_found", file=text,
                         hint="pass an existing checkpoint directory or a repo id such as "
                              "deepseek-ai/DeepSeek-V4-Flash")
    return _snapshot(text)


def hub_cache_dir(source: str | Path) -> Path | None:
    """The local Hugging Face cache folder (blobs and snapshots) of a repo id that names no local
    path, where it exists: what a side file (--report, --plot) must never be written into."""
    text = str(source)
    if Path(text).expanduser().exists() or not _REPO_ID.match(text) or text.startswith((".", "~")):
        return None
    from huggingface_hub.constants import HF_HUB_CACHE
    folder = Path(HF_HUB_CACHE) / ("models--" + text.replace("/", "--"))
    return folder if folder.is_dir() else None


def _snapshot(repo_id: str) -> Path:
    from huggingface_hub import constants as hub_constants
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, ignore_patterns=HUB_IGNORE)).resolve()
    except (RepositoryNotFoundError, GatedRepoError, RevisionNotFoundError) as e:
        raise InputError(f"Hugging Face repo {repo_id} was not found or is not accessible "
                         f"({type(e).__name__})", error_id="hub.repo_not_found", file=repo_id,
                         hint="check the spelling; for gated or private repos run `hf auth login` first") from None
    except LocalEntryNotFoundError as e:
        # huggingface_hub >= 1.x refuses a cached snapshot that lacks files its cached tree listing names
        # (IncompleteSnapshotError, with the folder); a snapshot cached by vLLM has no README.md or docs, and
        # what matters is whether everything the engines read is there
        partial = getattr(e, "snapshot_path", None)
        if partial and _has_weights(Path(partial)):
            return Path(partial).resolve()
        offline = hub_constants.HF_HUB_OFFLINE  # the hub's own reading of HF_HUB_OFFLINE
        raise InputError(f"there is no directory {repo_id} here, and as a Hugging Face repo id it is not in the "
                         "local cache and cannot be downloaded (" + ("HF_HUB_OFFLINE is set)" if offline
                                                                      else "no connection)"),
                         error_id="hub.not_cached", file=repo_id,
                         hint="check the path; or download the repo once with network access (`hf download "
                              f"{repo_id}`)" + (", or unset HF_HUB_OFFLINE" if offline else "")) from None
    except (OSError, ValueError) as e:
        raise InputError(f"downloading {repo_id} failed: {e}", error_id="hub.download_failed", file=repo_id,
                         hint="retry, or download it with `hf download` and pass the directory") from None


def _has_weights(root: Path) -> bool:
    """config.json and every shard the index names (or model.safetensors) are there."""
    if not (root / CONFIG).is_file():
        return False
    if (root / INDEX_FILE).is_file():
        try:
            shards = set(read_weight_map(root).values())
        except InputError:
            return False
        return bool(shards) and all((root / f).is_file() for f in shards)
    return (root / SINGLE_FILE).is_file()
