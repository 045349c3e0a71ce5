"""Optional dependencies: imported where needed, named by their extra.

memjax's core (training, evaluation, export, ``memjax.load``, scoring and
generation of every model family) needs only JAX, Flax, Optax, Orbax and
small pure-Python packages. The heavy packages are optional and load only
where they are used:

* ``[data]``: SeqIO, TensorFlow, tensorflow-text and tensorflow-datasets,
  which turn raw text into token streams (once; the streams are cached) and
  keep the SeqIO tasks registered for t5x/seqio users;
* ``[beam]``: Apache Beam, which runs the offline BM25 packing as a
  cached SeqIO task (``memjax.methods.trime.pack_beam``);
* ``[retrieval]``: ScaNN, the index of the external datastores;
* ``[pretrained]``: safetensors and tokenizers, which read a Hugging Face
  folder's weights and tokenizer (``memjax.pretrained``).

A missing one is one line (``errors.MissingDependencyError``, exit status
2) naming the extra that provides it. TensorFlow is imported only through
:func:`tensorflow`, which hides the GPUs and TPUs from it before it can
claim their memory (as t5x and big_vision do): JAX owns the accelerators.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from types import ModuleType

from memjax import errors

# Top-level module -> (pip package, setup.py extra).
PACKAGES: dict[str, tuple[str, str]] = {
    "tensorflow": ("tensorflow", "data"),
    "tensorflow_text": ("tensorflow-text", "data"),
    "tensorflow_datasets": ("tensorflow-datasets", "data"),
    "seqio": ("seqio", "data"),
    "apache_beam": ("apache-beam", "beam"),
    "scann": ("scann", "retrieval"),
    "safetensors": ("safetensors", "pretrained"),
    "tokenizers": ("tokenizers", "pretrained"),
}


def require(module: str, purpose: str) -> ModuleType:
  """Imports ``module`` or raises one line naming the extra to install.

  Args:
    module: a module path whose top-level package is in :data:`PACKAGES`.
    purpose: what needs it, e.g. 'tokenising wikitext103'.

  Raises:
    errors.MissingDependencyError: the package is not installed.
  """
  top = module.split(".")[0]
  if top == "tensorflow" or top == "seqio":
    tensorflow(purpose)  # SeqIO imports TensorFlow: hide the devices first.
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise _missing(e, purpose) from None


# Where the installed memjax's metadata names no repository (setup.py's
# REPOSITORY before its publisher set it).
_PLACEHOLDER = "https://github.com/<owner>/memjax"


def repository() -> str:
  """The repository URL of the installed memjax (setup.py's ``url``)."""
  try:
    meta = importlib.metadata.metadata("memjax")
  except importlib.metadata.PackageNotFoundError:
    return _PLACEHOLDER
  urls = [meta.get("Home-page") or ""]
  urls += [
      u.split(",", 1)[-1].strip() for u in meta.get_all("Project-URL") or []
  ]
  return next((u for u in urls if u), _PLACEHOLDER)


def install_hint(extra: str) -> str:
  """What installs ``extra``: memjax is not on PyPI, so from a checkout or
  from its repository."""
  return (
      f"pip install -e '.[{extra}]' in a memjax checkout, or pip install "
      f"'memjax[{extra}] @ git+{repository()}' (or the requirements/ lock "
      "of your platform)"
  )


def _missing(e: ImportError, purpose: str) -> errors.MissingDependencyError:
  name = (e.name or "").split(".")[0]
  package, extra = PACKAGES.get(name, (name or str(e), "data"))
  return errors.MissingDependencyError(
      f"{purpose} needs {package}, which is not installed: "
      + install_hint(extra)
  )


_HIDDEN = False


def tensorflow(purpose: str) -> ModuleType:
  """TensorFlow, with every GPU and TPU hidden from it.

  JAX and TensorFlow in one process would both claim the accelerators'
  memory; memjax uses TensorFlow for tf.data inside SeqIO only, which runs
  on the CPU.

  Raises:
    errors.MissingDependencyError: TensorFlow is not installed.
  """
  global _HIDDEN
  try:
    tf = importlib.import_module("tensorflow")
  except ImportError as e:
    raise _missing(e, purpose) from None
  if not _HIDDEN:
    for kind in ("GPU", "TPU"):
      try:
        tf.config.set_visible_devices([], kind)
      except (RuntimeError, ValueError):
        pass  # Already initialised (devices in use), or no such kind.
    _HIDDEN = True
  return tf
