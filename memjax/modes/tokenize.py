"""``--mode=tokenize``: write a run's token caches and vocabulary, train nothing.

Raw text becomes token streams through the SeqIO tasks (the ``[data]``
extra: SeqIO and TensorFlow). Running this mode where they are installed
fills ``data.cache_dir`` (default ``<workdir>/cache``); a run elsewhere (a
stock JAX image on a GPU node, a TPU VM) with the same config and a copy of
that folder then reads the caches without those packages, with a copy of
the corpus at any path or with no corpus at all: the caches are named by
the files' content (``memjax.data.content``; see docs/hardware.md).
"""

from __future__ import annotations

from typing import Any

from memjax.io import paths
from memjax.run import spec


def tokenize(run: spec.Run) -> dict[str, Any]:
  """Tokenises the training and evaluation splits of the run's task.

  Returns:
    {'files': the files now in the cache directory}.

  Raises:
    errors.UserError: missing data or a missing ``[data]`` package.
  """
  run.task.check_data(train=True, workdir=run.workdir)
  data = run.task.load(run.workdir, train=True)
  cache = data.cache_dir
  names = sorted(n for n in paths.listdir(cache) if ".tmp" not in n)
  files = [paths.join(cache, n) for n in names]
  # The content/ folder holds the corpus files' SHA-256 and the records
  # that let a run read the caches without the corpus (data.content).
  return {"files": [f for f in files if paths.isfile(f)]}
