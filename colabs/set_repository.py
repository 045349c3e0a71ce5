"""Writes the repository URL the notebooks clone in Colab.

    python colabs/set_repository.py https://github.com/me/memjax.git

The URL lives in ``colabs/setup_cell.py``, the set-up cell every notebook
starts with; this script sets it there and copies the cell into each
notebook (``tests/colabs/test_notebooks.py`` checks that they agree).
"""

import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "setup_cell.py")
_URL = re.compile(r"('MEMJAX_REPO', )'[^']*'")
# The set-up code ends where each notebook's own imports begin.
END = "os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')"


def set_url(url: str) -> None:
  """Sets ``url`` in the template and the set-up cell of every notebook."""
  with open(TEMPLATE, encoding="utf-8") as f:
    cell = _URL.sub(lambda m: f"{m.group(1)}{url!r}", f.read())
  with open(TEMPLATE, "w", encoding="utf-8") as f:
    f.write(cell)
  for path in sorted(glob.glob(os.path.join(HERE, "*.ipynb"))):
    with open(path, encoding="utf-8") as f:
      nb = json.load(f)
    source = "".join(nb["cells"][1]["source"])
    new = cell + source[source.index(END) :]
    nb["cells"][1]["source"] = new.splitlines(keepends=True)
    with open(path, "w", encoding="utf-8") as f:
      json.dump(nb, f, indent=1, ensure_ascii=False)
      f.write("\n")


if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit("usage: python colabs/set_repository.py URL")
  set_url(sys.argv[1])
