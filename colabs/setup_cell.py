import importlib.util
import os
import pathlib
import subprocess
import sys

# Colab only: the memjax repository to clone. Its publisher sets it once in
# setup.py and runs `python colabs/set_repository.py`, which writes it here,
# into every notebook and CITATION.cff. MEMJAX_REPO overrides it, e.g. with
# the path of a local clone.
MEMJAX_REPO = os.environ.get(
    'MEMJAX_REPO', 'https://github.com/<owner>/memjax.git'
)
IN_COLAB = 'google.colab' in sys.modules


def is_checkout(path):
  return (path / 'memjax').is_dir() and (path / 'configs').is_dir()


ROOT = os.environ.get('MEMJAX_ROOT')
if not ROOT:  # The kernel's directory or one above it.
  here = pathlib.Path.cwd().resolve()
  ROOT = next((str(p) for p in (here, *here.parents) if is_checkout(p)), None)
if not ROOT and (spec := importlib.util.find_spec('memjax')):  # pip install -e
  checkout = pathlib.Path(spec.origin).parent.parent
  ROOT = str(checkout) if is_checkout(checkout) else None
if not ROOT and IN_COLAB:
  ROOT = os.environ.get('MEMJAX_CLONE', '/content/memjax')
  if not os.path.isdir(ROOT) and '<owner>' in MEMJAX_REPO:
    sys.exit(
        'memjax: error: this notebook names no repository to clone yet'
        f' ({MEMJAX_REPO}): its publisher sets the URL with `python'
        ' colabs/set_repository.py https://github.com/OWNER/memjax`; or set'
        " os.environ['MEMJAX_REPO'] to a clone URL and run this cell again"
    )
  if not os.path.isdir(ROOT):
    subprocess.run(['git', 'clone', '-q', MEMJAX_REPO, ROOT], check=True)
if not ROOT:
  raise RuntimeError('No memjax checkout here or above: set MEMJAX_ROOT.')
ROOT = os.path.abspath(ROOT)
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)  # `configs` is not installed with the package.
if IN_COLAB:
  os.chdir(ROOT)
  from colabs import colab  # Imports nothing memjax depends on.
