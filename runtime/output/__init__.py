"""The output path's one owner: `OutputTree` (tree.py) takes OUT from the command line to publish
(checks, staging directory, lock, progress record, publish, leftovers). Behind it: the path-safety
rules (rules.py), the locks (claim.py) and the small records (records.py), which no module outside this
package uses. names.py holds the two rules that others read without a tree: runtime/manifest.py and
runtime/side_files.py import it directly, as their code never reaches the tree (every command imports
side_files; tests/reliability/test_hint_flags.py reads which hints a command can print from these imports)."""

from .names import inside_staging, record_name_ok
from .rules import out_path, refuse_reserved_names
from .tree import OutputTree, output_paths

__all__ = ["OutputTree", "inside_staging", "output_paths", "out_path", "record_name_ok", "refuse_reserved_names"]
