"""``--mode=tokenize``: write a run's token caches and vocabulary, train nothing.

Raw text becomes token streams through the SeqIO tasks (the ``[data]``
extra: SeqIO and TensorFlow). Running this mode where they are installed
fills ``data.cache_dir`` (default ``<workdir>/cache``); a run elsewhere (a
stock JAX image on a GPU node, a TPU VM) with the same config and
``data.cache_dir`` then reads the caches without those packages (see
docs/hardware.md).
"""

from __future__ import annotations

from typing import Any

import ml_collections

from memjax.io import paths
from memjax.tasks import base as task_lib


def tokenize(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Tokenises the training and evaluation splits of ``config``'s task.

  Returns:
    {'files': the files now in the cache directory}.

  Raises:
    errors.UserError: missing data or a missing ``[data]`` package.
  """
  task = task_lib.get(config)
  task.check_config(config)
  task.check_data(config, train=True)
  data = task.load(config, workdir, train=True)
  cache = data.cache_dir
  names = sorted(n for n in paths.listdir(cache) if ".tmp" not in n)
  return {"files": [paths.join(cache, n) for n in names]}
