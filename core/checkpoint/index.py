"""The files around the shards: JSON configs and the shard index, read strictly, and the index
checked against the shard headers (every tensor in exactly one shard, the one the index names).
Each refusal is an InputError with its id, the file and the fix (docs/ERRORS.md)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import InputError
from ..files import INDEX_FILE
from .small_files import read_small_text
from .tensor_model import TensorRef

__all__ = ["check_index", "listing", "lone_surrogate", "natural_key", "read_json", "read_weight_map",
           "unsafe_shard_paths"]

_MAX_LISTED = 5
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # only such an escape can put a surrogate in decoded JSON


def lone_surrogate(text: str, strings) -> str | None:
    """The first of `strings` (decoded from the JSON `text`) that is not valid UTF-8, shown escaped; None
    when all are. Text decoded from UTF-8 holds no surrogate, so only a `\\uD800`-`\\uDFFF` escape that
    is not half of a pair makes one: JSON allows it, the safetensors library refuses it, and such a name
    can be written neither to a file nor to a terminal."""
    if not _SURROGATE_ESCAPE.search(text):
        return None
    for s in strings:
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:
            return s.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    return None


def _strings(obj):
    """Every key and string value of a decoded JSON document."""
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            yield o
        elif isinstance(o, dict):
            yield from o
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)


def read_json(path: Path, *, missing_id: str | None, bad_id: str, what: str) -> dict | None:
    try:
        text = read_small_text(path)
    except FileNotFoundError:
        if missing_id is None:
            return None
        raise InputError(f"{path} is missing; every checkpoint needs its {what}", error_id=missing_id,
                         file=str(path), hint="pass the checkpoint root directory (the one with config.json)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {path}: {e}", error_id=bad_id, file=str(path),
                         hint=f"re-download the {what}") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON ({e.msg}, line {e.lineno} column {e.colno})",
                         error_id=bad_id, file=str(path), hint=f"re-download or repair the {what}") from None
    except (ValueError, RecursionError) as e:  # an integer of over 4300 digits; nesting too deep
        raise InputError(f"{path} is not valid JSON ({type(e).__name__}: {str(e)[:120]})",
                         error_id=bad_id, file=str(path), hint=f"re-download or repair the {what}") from None
    if not isinstance(obj, dict):
        raise InputError(f"{path} must hold a JSON object, found {type(obj).__name__}", error_id=bad_id,
                         file=str(path), hint=f"re-download or repair the {what}")
    bad = lone_surrogate(text, _strings(obj))
    if bad is not None:
        raise InputError(f"{path} holds the string {bad!r:.200}, which escapes a lone UTF-16 surrogate: not valid "
                         "UTF-8", error_id=bad_id, file=str(path), hint=f"re-download or repair the {what}")
    return obj


def listing(items: list[str]) -> str:
    shown = ", ".join(items[:_MAX_LISTED])
    return shown + (f" and {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else "")


def read_weight_map(root: Path) -> dict[str, str]:
    path = root / INDEX_FILE
    index = read_json(path, missing_id=None, bad_id="index.not_json", what="shard index")
    wm = index.get("weight_map") if index is not None else None
    if not isinstance(wm, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in wm.items()):
        raise InputError(f"{path} must have a \"weight_map\" object mapping tensor names to shard files",
                         error_id="index.bad_schema", file=str(path), hint="re-download or rebuild the index")
    files = set(wm.values())  # a few shards named by thousands of tensors: check each file once
    unsafe = unsafe_shard_paths(files)
    if unsafe:
        raise InputError(f"{path} maps tensors to files outside the checkpoint directory: {listing(unsafe)}",
                         error_id="index.unsafe_path", file=str(path),
                         hint="shard names must be relative paths inside the checkpoint; rebuild the index")
    nested = sorted({f for f in files if "/" in f or "\\" in f})
    if nested:  # the output keeps one folder of shards: a/x and b/x would become one file
        raise InputError(f"{path} maps tensors to shard files in subfolders: {listing(nested)}",
                         error_id="index.nested_shard", file=str(path),
                         hint="put every shard beside the index (a Hugging Face checkpoint keeps them in its root) "
                              "and name them there")
    return wm


def unsafe_shard_paths(files) -> list[str]:
    """The index's shard names that would lead out of the checkpoint directory (absolute, `..`, empty),
    sorted. The one home of this rule: every command applies it before it opens a file the index names
    (read_weight_map refuses them; validate's header scan never opens them)."""
    return sorted({f for f in files if not f or Path(f).is_absolute() or ".." in Path(f).parts})


def check_index(root: Path, weight_map: dict[str, str], headers: dict[str, dict[str, TensorRef]]) -> None:
    index = str(root / INDEX_FILE)
    seen: dict[str, str] = {}
    for shard, refs in headers.items():
        for name in refs:
            if name in seen:
                raise InputError(f"tensor {name} is stored in two shards: {seen[name]} and {shard}",
                                 error_id="index.duplicate_tensor", tensor=name, file=str(root / shard),
                                 hint="remove the stale copy or re-download the checkpoint")
            seen[name] = shard
    missing = [f"{k} (index says {v})" for k, v in weight_map.items() if k not in headers[v]]
    if missing:
        raise InputError(f"{len(missing)} tensors listed in the index are not in the shard it names: "
                         f"{listing(missing)}", error_id="index.key_missing_in_shard", file=index,
                         tensor=next(iter(k for k, v in weight_map.items() if k not in headers[v])),
                         hint="the index and the shards come from different versions: re-download both")
    extra = [f"{k} ({v})" for k, v in seen.items() if k not in weight_map]
    if extra:
        raise InputError(f"{len(extra)} tensors in the shards are not in the index: {listing(extra)}",
                         error_id="index.key_not_in_index", file=index,
                         tensor=next(k for k in seen if k not in weight_map),
                         hint="the index is stale or incomplete: re-download it")


def natural_key(name: str):
    # odd parts are the digit runs; str.isdigit() would also take "²", which int() refuses
    return [int(t) if i % 2 else t for i, t in enumerate(re.split(r"(\d+)", name))]
