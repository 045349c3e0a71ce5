"""The demo: TRIME against vanilla and the continuous cache on the demo corpus.

    python -m memjax.demos.trime --workdir=runs/demo

Rows (Tables 2-3 of the TRIME paper, at demo scale; ``trime_rows.ROWS``):
vanilla; vanilla + continuous cache (over M_local, N = 0) beside TRIMELM
(M_local); vanilla + continuous cache (long) beside TRIMELM_long (M_local u
M_long), both tuned over the same sizes N.

Every trained row trains the same number of steps on the same model and
batch size; test is scored once, at the setting chosen on valid. The table
lands in ``<workdir>/table.md`` and ``<workdir>/table.json``. A row whose
workdir already holds a run finished with the same steps is read back and
only its memory tuned again, so an interrupted demo continues where it
stopped and a changed memory setting is never read back stale.
"""

from __future__ import annotations

from memjax.demos import common
from memjax.demos import trime_rows

FLAGS = common.define_flags(
    "runs/demo", rows="Subset of rows to run (default: all)."
)
ROWS = trime_rows.ROWS


def main() -> None:
  common.run_rows(
      FLAGS,
      ROWS,
      trime_rows.run_row,
      trime_rows.format_table,
      about="WikiText format",
  )


if __name__ == "__main__":
  common.run(main)
