"""benchmarks/import_memory.py: the import's peak host memory, bounded.

The importing child's peak resident memory, on a bfloat16 checkpoint of
three shards of tens of MB, stays within what a streamed import needs: the
process's own footprint (an import of the 20k-parameter fixture, measured
the same way), the largest shard mapped, the parameters once in bfloat16,
and 64 MB of slack. An import that held the checkpoint twice, or in
float32, would pass it by more than the checkpoint's size.
"""

import argparse
import os

from benchmarks import import_memory
from tests.conftest import REPO

MB = 2**20


def test_a_streamed_import_holds_one_shard_and_the_parameters_once(tmp_path):
  tiny = import_memory.import_once(
      os.path.join(REPO, "tests", "fixtures", "pretrained", "llama_gqa"),
      str(tmp_path / "tiny"),
      "bfloat16",
      REPO,
  )
  got = import_memory.measure(
      argparse.Namespace(
          size="small",
          shards=4,
          dtypes="bfloat16",
          dir=str(tmp_path / "small"),
          keep=False,
          tree=REPO,
      )
  )
  assert got["shards"] >= 3 and got["largest_shard_bytes"] > 20 * MB
  params_bf16 = 2 * got["parameters"]
  bound = (
      tiny["peak_rss_bytes"]
      + got["largest_shard_bytes"]
      + params_bf16
      + 64 * MB
  )
  peak = got["imports"]["bfloat16"]["peak_rss_bytes"]
  assert peak <= bound, (peak / MB, bound / MB)
  assert got["imports"]["bfloat16"]["meets_goal"]
