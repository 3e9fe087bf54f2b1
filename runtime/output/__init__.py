"""The output path's one owner: `OutputTree` (tree.py) takes OUT from the command line to publish
(checks, staging directory, lock, progress record, publish, leftovers). Behind it: the path-safety
rules (rules.py), taking the staging directory (claim.py) and its small records (records.py), which
no module outside this package uses."""

from .claim import inside_staging
from .rules import out_path, record_name_ok, refuse_reserved_names
from .tree import OutputTree, output_paths

__all__ = ["OutputTree", "inside_staging", "output_paths", "out_path", "record_name_ok", "refuse_reserved_names"]
