"""A datastore of (g, next token) pairs on disk: the external memory M_ext.

A trained model is run over a corpus split with the evaluation windows
(``windows.memory_eval_batches``: every prediction gets the context it gets
when scored), and each scored prediction adds one pair: the key g (the
memory feature of the TRIME loss, the last feed-forward block's input) as
float16, and the value, the token that followed, as int32 (WikiText-103's
267,735 types overflow int16; values are generic integers).

Layout of a datastore directory::

    build.json              the build's parameters (fixed once started)
    shard-00000.keys        [count, dim] float16, raw (np.memmap)
    shard-00000.values      [count] int32, raw
    shard-00000.json        written last: the shard is complete
    ...
    manifest.json           the joined datastore (signature, dim, dtypes,
                            count, corpus, split, context, shards, id)

Shard s holds the scored predictions of evaluation batches
[s * shard_batches, (s + 1) * shard_batches), in stream order. A build is
resumable (complete shards are kept, an interrupted one is written again)
and shardable (process k of n writes shards s with s % n == k); whichever
process finds every shard complete writes the manifest, which joins them.
The writing steps are ``memory/shards.py``'s, shared with
``memory/datastore_batches.py``.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from memjax.checkpoints import checkpointing
from memjax.checkpoints import convert
from memjax import errors
from memjax.io import paths
from memjax import sharding as sharding_lib
from memjax.data import windows
from memjax.memory import evaluation
from memjax.memory import shards
from memjax.models import variables as model_vars

KEY_DTYPE = shards.KEY_DTYPE
VALUE_DTYPE = shards.VALUE_DTYPE


@dataclasses.dataclass
class Datastore:
  """A joined datastore, its shards memory-mapped read-only.

  Attributes:
    path: the directory.
    manifest: manifest.json.
    keys: per shard, [n_s, dim] float16 memmaps (of a local copy when the
      datastore is at a URL).
    values: per shard, [n_s] int32 memmaps.
  """

  path: str
  manifest: dict[str, Any]
  keys: list[np.ndarray]
  values: list[np.ndarray]

  @property
  def dim(self) -> int:
    return int(self.manifest["dim"])

  @property
  def count(self) -> int:
    return int(self.manifest["count"])

  @property
  def offsets(self) -> np.ndarray:
    """[num_shards + 1] first global index of each shard, then count."""
    return np.cumsum([0] + [len(v) for v in self.values])

  def gather(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys [..., dim] float32 and values [...] int32 at global indices
    ``idx`` [...] (-1: zeros)."""
    idx = np.asarray(idx)
    flat = idx.reshape(-1)
    keys = np.zeros((flat.size, self.dim), np.float32)
    vals = np.zeros((flat.size,), np.int32)
    shard = np.searchsorted(self.offsets, flat, side="right") - 1
    for s in np.unique(shard[flat >= 0]):
      sel = np.nonzero((shard == s) & (flat >= 0))[0]
      local = flat[sel] - self.offsets[s]
      keys[sel] = self.keys[s][local]
      vals[sel] = self.values[s][local]
    return keys.reshape(idx.shape + (self.dim,)), vals.reshape(idx.shape)

  def gather_values(self, idx: np.ndarray) -> np.ndarray:
    """Values [...] int32 at global indices ``idx`` [...] (-1: 0), no keys
    read."""
    idx = np.asarray(idx)
    flat = idx.reshape(-1)
    vals = np.zeros((flat.size,), np.int32)
    shard = np.searchsorted(self.offsets, flat, side="right") - 1
    for s in np.unique(shard[flat >= 0]):
      sel = np.nonzero((shard == s) & (flat >= 0))[0]
      vals[sel] = self.values[s][flat[sel] - self.offsets[s]]
    return vals.reshape(idx.shape)


def open_datastore(
    path: str,
    *,
    signature: Optional[dict[str, Any]] = None,
    dim: Optional[int] = None,
    checkpoint: Optional[dict[str, Any]] = None,
    window_bos: Optional[int] = None,
) -> Datastore:
  """Opens and checks a joined datastore (read-only; nothing is written).

  Args:
    path: its directory.
    signature: the model it must belong to (``memjax.run.spec.Run.signature``).
    dim: the feature dimension it must have.
    checkpoint: {'source', 'step'} of the parameters it must come from
      (checked when the manifest records one).
    window_bos: the BOS the scored windows begin with
      (``rows.Scoring.window_bos``): a datastore of a model whose tokenizer
      adds one must have been built with it.

  Raises:
    errors.DataError: no manifest, another format or dtype, a shard missing
      or of the wrong size, built without the BOS the tokenizer adds.
    errors.CheckpointMismatchError: built by another model or dimension.
  """
  mpath = paths.join(path, "manifest.json")
  if not paths.exists(mpath):
    raise errors.DataError(
        f"no datastore at {path} (no manifest.json); build it with "
        "--mode=datastore"
    )
  m = paths.read_json(mpath)
  if m.get("key_dtype") != KEY_DTYPE or m.get("value_dtype") != VALUE_DTYPE:
    raise errors.DataError(
        f"datastore {path} has keys {m.get('key_dtype')} / values "
        f"{m.get('value_dtype')}; this version reads {KEY_DTYPE} / "
        f"{VALUE_DTYPE}: rebuild it with --mode=datastore"
    )
  if window_bos is not None and m.get("context", {}).get("window_bos") != (
      window_bos
  ):
    raise errors.DataError(
        f"datastore {path} was built from text without the BOS its "
        "tokenizer adds (an earlier version): build it again with "
        "--mode=datastore into another eval_memory.datastore"
    )
  if dim is not None and int(m["dim"]) != int(dim):
    raise errors.CheckpointMismatchError(
        f"datastore {path} has features of dimension {m['dim']}, the model "
        f"{dim}: build a datastore with this model"
    )
  diffs = []
  if signature is not None:
    # A datastore built by an earlier version recorded that version's
    # signature: compared as today's would read it.
    saved_signature = convert.upgrade(m.get("signature", {}))
    diffs = checkpointing.compare_signatures(
        saved_signature.get("model", {}), signature.get("model", {})
    )
  saved = m.get("checkpoint")
  if checkpoint is not None and saved and saved != checkpoint:
    diffs.append(
        f"built from {saved['source']} step {saved['step']}, not "
        f"{checkpoint['source']} step {checkpoint['step']}"
    )
  if diffs:
    raise errors.CheckpointMismatchError(
        f"datastore {path} was built by another model ({'; '.join(diffs[:4])}"
        "): build one with this model (--mode=datastore into another "
        "eval_memory.datastore)"
    )
  d = int(m["dim"])
  opened = [_open_shard(path, shard, d) for shard in m["shards"]]
  keys = [k for k, _ in opened]
  values = [v for _, v in opened]
  return Datastore(path, m, keys, values)


def _open_shard(path: str, shard: dict[str, Any], d: int):
  """Memory-maps one shard's keys [n, d] and values [n] after checking that
  both files exist with their sizes (raises errors.DataError)."""
  base = paths.join(path, shard["name"])
  n = int(shard["count"])
  for suffix, size in ((".keys", n * d * 2), (".values", n * 4)):
    f = base + suffix
    if not paths.exists(f):
      raise errors.DataError(
          f"datastore {path}: shard file {paths.basename(f)} is missing; "
          "rebuild that shard with --mode=datastore"
      )
    if paths.getsize(f) != size:
      raise errors.DataError(
          f"datastore {path}: {paths.basename(f)} has "
          f"{paths.getsize(f)} bytes, expected {size} (truncated?); "
          "delete it and its .json and resume --mode=datastore"
      )
  if not n:
    return np.zeros((0, d), np.float16), np.zeros((0,), np.int32)
  return (
      np.memmap(
          paths.local_file(base + ".keys"), np.float16, "r", shape=(n, d)
      ),
      np.memmap(paths.local_file(base + ".values"), np.int32, "r", shape=(n,)),
  )


def make_feature_fn(model: Any, score_len: int) -> Callable:
  """``fn(params, batch) -> (g [W, S, D], targets [W, S], positions [W, S])``
  over the scored predictions of a ``memory_eval_batches`` batch; positions
  are -1 where nothing is scored."""

  def fn(params, batch):
    out = model.apply(
        model_vars.as_variables(params),
        batch["inputs"],
        batch["targets"],
        deterministic=True,
    )
    q = evaluation.scored_queries(out.features, batch, score_len)
    return q.g, q.targets, q.positions

  return fn


@dataclasses.dataclass(frozen=True)
class BuildSpec:
  """What a datastore is built from (build.json); fixed once started."""

  signature: dict[str, Any]
  checkpoint: dict[str, Any]
  dim: int
  corpus: str
  split: str
  window_len: int
  score_len: int
  batch_size: int
  shard_batches: int
  num_tokens: int
  window_bos: Optional[int] = None

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def _batches(tokens, spec: BuildSpec) -> Iterator[dict[str, np.ndarray]]:
  return windows.memory_eval_batches(
      tokens, spec.window_len, spec.score_len, spec.batch_size, spec.window_bos
  )


def num_shards(spec: BuildSpec) -> int:
  starts = windows.memory_eval_windows(
      max(spec.num_tokens - 1, 0), spec.window_len, spec.score_len
  )
  batches = -(-len(starts) // spec.batch_size)
  return max(1, -(-batches // spec.shard_batches))


def check_build_dir(path: str, spec: BuildSpec) -> None:
  """Raises a UserError if ``path`` holds a datastore or build of anything
  else than ``spec`` (nothing is written)."""
  bpath = paths.join(path, "build.json")
  if not paths.exists(bpath):
    if paths.isdir(path) and paths.listdir(path):
      raise errors.DataError(
          f"{path} is not empty and holds no datastore build: choose another "
          "eval_memory.datastore"
      )
    return
  old = paths.read_json(bpath)
  if "window_bos" in spec.to_json():  # A build from before the field.
    old.setdefault("window_bos", None)
  if "signature" in old:  # As today's signature reads an earlier one.
    old["signature"] = convert.upgrade(old["signature"])
  if old.get("signature", {}).get("model") != spec.signature["model"]:
    raise errors.CheckpointMismatchError(
        f"the datastore at {path} was built by another model: choose another "
        "eval_memory.datastore (or delete it)"
    )
  if old != spec.to_json():
    diff = sorted(
        k
        for k in set(old) | set(spec.to_json())
        if old.get(k) != spec.to_json().get(k)
    )
    raise errors.ResumeError(
        f"the datastore build at {path} has other settings ({', '.join(diff)}):"
        " resume it with the same ones or choose another eval_memory.datastore"
    )


def build(
    model: Any,
    params: Any,
    tokens: np.ndarray,
    spec: BuildSpec,
    path: str,
    *,
    mesh: Any,
    process_index: int = 0,
    process_count: int = 1,
    stop_after_shards: int = 0,
) -> Optional[Datastore]:
  """Writes this process's shards of a datastore and joins it when complete.

  Args:
    model: the TransformerLM.
    params: its parameters.
    tokens: [N] the split's token stream.
    spec: the build (``check_build_dir`` must have passed).
    path: the datastore directory.
    mesh: device mesh (batches are split over its data axes).
    process_index: k; this process writes shards s with s % n == k.
    process_count: n.
    stop_after_shards: stop after writing this many shards (0: all); for
      tests of an interrupted build.

  Returns:
    The joined datastore, or None while other processes' shards are missing.
  """
  fn = sharding_lib.jit(make_feature_fn(model, spec.score_len), mesh)
  keys_per_shard = spec.shard_batches * spec.batch_size * spec.score_len
  done = shards.write(
      path,
      spec.to_json(),
      num_shards(spec),
      (process_index, process_count),
      lambda b: fn(params, sharding_lib.put_global_batch(b, mesh)),
      _shard_batches(tokens, spec),
      spec.dim,
      expected_keys=lambda n: min(n * keys_per_shard, spec.num_tokens - 1),
      stop_after_shards=stop_after_shards,
  )
  return join(path, spec) if done else None


def _shard_batches(
    tokens: np.ndarray, spec: BuildSpec
) -> Callable[[int], Iterable[dict[str, np.ndarray]]]:
  """``batches(s)``: shard s's evaluation batches [s * shard_batches,
  (s + 1) * shard_batches), all from one pass over the stream (shards are
  asked for in ascending order, each read whole before the next)."""
  stream, cursor = _batches(tokens, spec), [0]

  def batches(s: int) -> Iterable[dict[str, np.ndarray]]:
    first = s * spec.shard_batches
    out = itertools.islice(
        stream, first - cursor[0], first - cursor[0] + spec.shard_batches
    )
    cursor[0] = first + spec.shard_batches
    return out

  return batches


def _context(spec: BuildSpec) -> dict[str, Any]:
  """The manifest's ``context``: the windows the keys were computed in
  (and their BOS, where a tokenizer adds one)."""
  out = {"window_len": spec.window_len, "score_len": spec.score_len}
  if spec.window_bos is not None:
    out["window_bos"] = spec.window_bos
  return out


def join(path: str, spec: BuildSpec) -> Optional[Datastore]:
  """Writes manifest.json once every shard is complete (else None)."""
  joined = shards.join(
      path,
      num_shards(spec),
      signature=spec.signature,
      dim=spec.dim,
      corpus=spec.corpus,
      split=spec.split,
      context=_context(spec),
      checkpoint=spec.checkpoint,
  )
  return open_datastore(path) if joined else None


def from_arrays(
    path: str,
    keys: np.ndarray,
    values: np.ndarray,
    *,
    signature: dict[str, Any],
    shard_size: int = 0,
    corpus: str = "",
    split: str = "",
) -> Datastore:
  """Writes a joined datastore of given pairs (hand-made memories, tests).

  Args:
    path: a new directory.
    keys: [N, D] float (stored as float16).
    values: [N] int (stored as int32).
    signature: the model signature to record.
    shard_size: keys per shard (0: one shard).
    corpus: recorded in the manifest.
    split: recorded in the manifest.
  """
  keys = np.asarray(keys)
  n, d = keys.shape
  size = shard_size or max(n, 1)
  paths.makedirs(path)
  entries = []
  for s, a in enumerate(range(0, max(n, 1), size)):
    base = paths.join(path, shards.shard_name(s))
    paths.write_bytes(
        base + ".keys", keys[a : a + size].astype(np.float16).tobytes()
    )
    paths.write_bytes(
        base + ".values",
        np.asarray(values[a : a + size], np.int32).tobytes(),
    )
    entries.append(
        {
            "name": shards.shard_name(s),
            "count": int(min(size, n - a)),
            "first_position": a,
        }
    )
  shards.write_manifest(path, entries, signature, int(d), corpus, split, {})
  return open_datastore(path)
