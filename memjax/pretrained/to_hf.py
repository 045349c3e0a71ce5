"""``--mode=export --config.export.format=hf``: an imported model (or one
trained from an import, its architecture kept) as a Hugging Face folder.

The import keeps the folder's own files in its export (``hf/``:
``config.json``, ``generation_config.json``, ``tokenizer_config.json``,
``special_tokens_map.json`` where present, and ``tensors.json``, the
checkpoint's names of the tensors it read; ``keep_source``). The export
writes them back with the parameters in Hugging Face's layout
(``hf_writer``: safetensors, sharded), ``tokenizer.json`` and a
``generation_config.json``.

The layout is the inverse of the import's, derived from the family's own
params function (``registry.FAMILIES``), which only rearranges tensors
(reshape, transpose, slice): called with a ``take`` that hands each
checkpoint tensor out as the integers ``offset .. offset + size`` (disjoint
ranges), it returns memjax's tree in which every element says which
checkpoint element it came from (``probe``). Exporting scatters each
parameter's values to those places (``checkpoint_arrays``); every
checkpoint element must be written exactly once (a bug otherwise). So
every family the import reads is exported, with no code of its own.

Hugging Face has a class only for the architecture the stored
``config.json`` describes: a model whose settings differ from what the
family makes of it (``differences``; the dropouts and the other
``sizes.CONFIG_KEYS`` aside: a product-key memory inserted, other
feed-forward layers) or that was not imported is refused in one line,
before anything is written. A run trained from an import
(``train.init_from``, possibly through further runs and exports) finds its
import by following ``train.init_from`` and ``export.json``'s ``source``
(``find_import``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterable, Optional, Sequence

import flax
import jax
import numpy as np

from memjax import errors
from memjax.checkpoints import convert
from memjax.checkpoints import runfiles
from memjax.io import paths
from memjax.models import blocks
from memjax.pretrained import hf_config
from memjax.pretrained import hf_writer
from memjax.pretrained import registry
from memjax.pretrained import sizes
from memjax.run import restore
from memjax.run import spec

# Where an import's export keeps the Hugging Face folder's own files.
HF_DIR = "hf"
# The folder's files kept (those present), and written back by the export.
KEPT = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# The names of the checkpoint's tensors the import read (a JSON list).
TENSORS_FILE = "tensors.json"
# How many runs and exports ``find_import`` follows back.
_MAX_DEPTH = 16


def keep_source(folder: str, out: str, used: Iterable[str]) -> None:
  """Stores in an import's export ``out`` (under ``hf/``) the files of the
  Hugging Face ``folder`` it read (``KEPT``, those present) and the names
  of the tensors ``used``."""
  kept = paths.join(out, HF_DIR)
  paths.makedirs(kept)
  for name in KEPT:
    path = paths.join(folder, name)
    if paths.isfile(path):
      paths.write_text(paths.join(kept, name), paths.read_text(path))
  paths.write_json(paths.join(kept, TENSORS_FILE), sorted(used))


def _parents(path: str) -> list[str]:
  """The runs or exports ``path`` was made from: its saved config's
  ``train.init_from`` and its ``export.json``'s ``source``."""
  out = []
  config = paths.join(path, runfiles.CONFIG_FILE)
  if paths.isfile(config):
    try:
      train = json.loads(paths.read_text(config)).get("train") or {}
    except (ValueError, AttributeError):
      train = {}
    if isinstance(train, dict) and train.get("init_from"):
      parent = paths.resolve(str(train["init_from"]))
      if paths.basename(parent) == "checkpoints":
        parent = paths.dirname(parent)
      out.append(parent)
  meta = paths.join(path, runfiles.EXPORT_FILE)
  if paths.isfile(meta):
    source = paths.read_json(meta).get("source")
    if source and paths.isdir(str(source)):
      out.append(str(source))
  return [p for p in out if p != path]


def find_import(path: str, depth: int = 0) -> Optional[str]:
  """The import's export that ``path`` is or was made from (it holds
  ``hf/config.json``), or None."""
  if paths.isfile(paths.join(path, HF_DIR, "config.json")):
    return path
  if depth >= _MAX_DEPTH:
    return None
  for parent in _parents(path):
    found = find_import(parent, depth + 1)
    if found:
      return found
  return None


def differences(model: dict[str, Any], hf: dict[str, Any]) -> list[str]:
  """The model settings ``model`` (a saved config's) where they differ
  from those the family makes of ``hf`` (a config.json), the
  ``sizes.CONFIG_KEYS`` and options at their kinds' defaults aside: as
  'key=value (config.json makes it value)'."""
  family = registry.family_of(hf)
  want = json.loads(json.dumps(family.settings(family.text(hf))))
  got = json.loads(json.dumps(model))
  want_n, got_n = convert.without_defaults(want), convert.without_defaults(got)
  return [
      f"{k}={got.get(k)!r} (config.json makes it {want[k]!r})"
      for k in sorted(want)
      if k not in sizes.CONFIG_KEYS and got_n.get(k) != want_n[k]
  ]


class _TooMany(Exception):
  """The probe's integers do not fit its dtype."""


def probe(
    params_fn: Callable[..., Any], m: dict[str, Any], dtype: Any = np.uint32
) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, tuple[int, ...]]], int]:
  """Where each memjax parameter element comes from in the checkpoint.

  Args:
    params_fn: a family's params function (``registry.FAMILIES``).
    m: the model settings and ``vocab_size`` it is called with.
    dtype: the integers' dtype (int64 is taken when uint32 is too small).

  Returns:
    ({'a/b': the parameter's elements' checkpoint positions, int [shape]},
    {tensor name as taken: (its first position, its shape)} in the order
    taken, the checkpoint's number of elements N).
  """
  records: dict[str, tuple[int, tuple[int, ...]]] = {}
  end = [0]  # The next free position.

  def take(name: str, shape: tuple[int, ...]) -> np.ndarray:
    shape = tuple(int(s) for s in shape)
    size = int(np.prod(shape))
    if name not in records:
      if end[0] + size > np.iinfo(dtype).max:
        raise _TooMany()
      records[name] = (end[0], shape)
      end[0] += size
    offset, taken = records[name]
    if taken != shape:
      raise ValueError(f"{name} taken as {taken} and as {shape}")
    return np.arange(offset, offset + size, dtype=dtype).reshape(shape)

  try:
    tree = params_fn(m, take)
  except _TooMany:
    return probe(params_fn, m, np.int64)
  return flax.traverse_util.flatten_dict(tree, sep="/"), records, end[0]


def checkpoint_arrays(
    values: dict[str, np.ndarray],
    positions: dict[str, np.ndarray],
    records: dict[str, tuple[int, tuple[int, ...]]],
    total: int,
    dtype: Any,
) -> dict[str, np.ndarray]:
  """The checkpoint's tensors, each parameter's values scattered to its
  positions (``probe``), in ``dtype``.

  Args:
    values: {'a/b': the parameter's values [shape]}.
    positions: {'a/b': its elements' positions [shape]}, the same keys.
    records: {tensor name as taken: (first position, shape)} (``probe``).
    total: N, the number of checkpoint elements.
    dtype: the tensors' NumPy dtype.

  Returns:
    {tensor name as taken: array [its shape]}, in ``records``' order.

  Raises:
    ValueError: a parameter that is not a rearrangement of the taken
      tensors, or a checkpoint element written never or twice (a family's
      params function that computes, a bug here).
  """
  flat = np.zeros(total, dtype)
  count = np.zeros(total, np.uint8)
  written = 0
  for key, pos in positions.items():
    if pos.dtype.kind not in "iu":
      raise ValueError(f"{key} is computed, not taken from the checkpoint")
    flat[pos.ravel()] = np.asarray(values[key]).astype(dtype).ravel()
    count[pos.ravel()] += 1
    written += pos.size
  wrong = np.flatnonzero(count != 1)
  if wrong.size or written != total:
    at = int(wrong[0]) if wrong.size else 0
    name = next(n for n, (o, s) in records.items() if o + np.prod(s) > at)
    raise ValueError(
        f"the parameters write {written} of {total} checkpoint elements, "
        f"{wrong.size} of them not once (first in {name})"
    )
  return {
      n: flat[o : o + int(np.prod(s))].reshape(s)
      for n, (o, s) in records.items()
  }


def checkpoint_names(
    taken: Iterable[str], prefixes: Sequence[str], stored: Optional[list[str]]
) -> dict[str, str]:
  """{name as taken: the checkpoint's name}: the one the import read
  (``stored``, the ``tensors.json`` list: a name under any of the family's
  ``prefixes``, or bare), else the first prefix + name (an ``lm_head.``
  without it, as Hugging Face's causal LMs save it)."""
  have = set(stored or ())
  out = {}
  for name in taken:
    read = [p + name for p in prefixes if p + name in have]
    if read:
      out[name] = read[0]
    elif name in have or name.startswith("lm_head."):
      out[name] = name
    else:
      out[name] = prefixes[0] + name
  return out


def check_exportable(files: runfiles.RunFiles) -> tuple[str, dict[str, Any]]:
  """(the import's export ``files`` was made from, its stored
  config.json).

  Raises:
    errors.ConfigError: no import found, or a model of another
      architecture than the config.json's (one line each).
  """
  source = find_import(files.path)
  if source is None:
    raise errors.ConfigError(
        f"{files.path} holds no imported model ({HF_DIR}/config.json is "
        "neither in it nor in the runs and exports it was made from): "
        "export.format=hf writes models imported with --mode=import and "
        "those trained from them (train.init_from)"
    )
  hf = paths.read_json(paths.join(source, HF_DIR, "config.json"))
  saved = json.loads(runfiles.read_config_text(files)).get("model") or {}
  diff = differences(saved, hf)
  if diff:
    raise errors.ConfigError(
        f"{files.path}'s model is not the {hf.get('model_type')} of "
        f"{source}'s config.json ({'; '.join(diff)}): Hugging Face has no "
        "class for it; export it with export.format=memjax"
    )
  return source, hf


def _tensors(
    restored: restore.Restored, source: str, hf: dict[str, Any], dtype: Any
) -> dict[str, np.ndarray]:
  """{checkpoint name: tensor in ``dtype``} of the restored parameters.

  Raises:
    errors.ConfigError: parameters that are not the family's.
  """
  family = registry.family_of(hf)
  text = family.text(hf)
  m = dict(
      family.settings(text), vocab_size=int(hf_config.get(text, "vocab_size"))
  )
  positions, records, total = probe(family.params, m)
  values = {
      k: np.asarray(jax.device_get(v))
      for k, v in flax.traverse_util.flatten_dict(
          restored.params, sep="/"
      ).items()
  }
  bad = sorted(set(values) ^ set(positions)) + sorted(
      k
      for k in set(values) & set(positions)
      if values[k].shape != positions[k].shape
  )
  if bad:
    raise errors.ConfigError(
        f"{restored.path}'s parameters are not a {hf.get('model_type')}'s "
        f"(e.g. {', '.join(bad[:3])}): Hugging Face has no class for it"
    )
  arrays = checkpoint_arrays(values, positions, records, total, dtype)
  stored = paths.join(source, HF_DIR, TENSORS_FILE)
  names = checkpoint_names(
      records,
      family.prefixes,
      paths.read_json(stored) if paths.isfile(stored) else None,
  )
  return {names[n]: a for n, a in arrays.items()}


def _generation_config(source: str, hf: dict[str, Any]) -> str:
  """The import's generation_config.json, else one of config.json's
  special ids."""
  path = paths.join(source, HF_DIR, "generation_config.json")
  if paths.isfile(path):
    return paths.read_text(path)
  keys = ("bos_token_id", "eos_token_id", "pad_token_id")
  ids = {k: hf[k] for k in keys if hf.get(k) is not None}
  return json.dumps({"_from_model_config": True, **ids}, indent=2) + "\n"


def _write(
    out: str,
    tensors: dict[str, np.ndarray],
    limit: int,
    source: str,
    hf: dict[str, Any],
    restored: restore.Restored,
    dtype: str,
) -> list[str]:
  """Writes the folder ``out``; returns its safetensors files' names."""
  paths.makedirs(out)
  written = hf_writer.write_checkpoint(out, tensors, limit)
  config = dict(hf)
  for key in [k for k in ("torch_dtype", "dtype") if k in hf] or [
      "torch_dtype"
  ]:
    config[key] = dtype
  paths.write_json(paths.join(out, "config.json"), config)
  paths.write_text(
      paths.join(out, "generation_config.json"), _generation_config(source, hf)
  )
  restored.vocab.save(paths.join(out, "tokenizer.json"))
  for name in KEPT[2:]:
    path = paths.join(source, HF_DIR, name)
    if paths.isfile(path):
      paths.write_text(paths.join(out, name), paths.read_text(path))
  return written


# Multimodal model types whose language model Hugging Face also has alone:
# an import of one (which reads only the language model) is written as that
# text model.
TEXT_MODELS = {"gemma3": ("gemma3_text", "Gemma3ForCausalLM")}


def text_model_config(hf: dict[str, Any]) -> dict[str, Any]:
  """The config.json to write for an import of ``hf``: itself, or for a
  multimodal model (``TEXT_MODELS``) its language model's, whole."""
  if hf.get("model_type") not in TEXT_MODELS:
    return hf
  kind, architecture = TEXT_MODELS[hf["model_type"]]
  text = registry.family_of(hf).text(hf)
  return dict(text, model_type=kind, architectures=[architecture])


def export_hf(
    run: spec.Run,
    files: runfiles.RunFiles,
    out: str,
    dtype: str = "float32",
    shard_mb: float = 5000.0,
) -> dict[str, Any]:
  """Writes the run or export at ``files`` as a Hugging Face folder ``out``
  (a new folder), its tensors in ``dtype``, safetensors files of at most
  ``shard_mb`` MB (10^6 bytes; one tensor may pass it).

  Raises:
    errors.ConfigError: a bad dtype or shard size, ``out`` exists, or a
      model Hugging Face has no class for (before anything is written).
  """
  if dtype not in blocks.DTYPES:
    raise errors.ConfigError(
        f"export dtype must be one of {list(blocks.DTYPES)}, got {dtype!r}"
    )
  if not shard_mb > 0:
    raise errors.ConfigError(f"export.hf_shard_mb must be > 0, got {shard_mb}")
  out = paths.resolve(out)
  if paths.exists(out):
    raise errors.ConfigError(
        f"{out} already exists: remove it or pass another export directory"
    )
  source, hf = check_exportable(files)
  hf = text_model_config(hf)
  restored = restore.restore(run, files)
  if not hasattr(restored.vocab, "json_text"):
    raise errors.ConfigError(
        f"{files.path} has no tokenizer.json: export.format=hf needs the "
        "imported tokenizer"
    )
  tensors = _tensors(restored, source, hf, np.dtype(blocks.DTYPES[dtype]))
  tmp = out + ".partial"
  if paths.exists(tmp):
    paths.rmtree(tmp)
  written = _write(
      tmp, tensors, int(shard_mb * 1e6), source, hf, restored, dtype
  )
  paths.rename(tmp, out)
  n = sum(int(a.size) for a in tensors.values())
  line = (
      f"exported step {restored.step} ({n:,} parameters, {dtype}) as a "
      f"Hugging Face {hf.get('model_type')} to {out}: "
      f"{len([w for w in written if w.endswith('.safetensors')])} "
      f"safetensors file(s), {paths.du(out) / 2**20:.1f} MiB"
  )
  return {"summary_lines": [line], "results_path": out, "export": out}
