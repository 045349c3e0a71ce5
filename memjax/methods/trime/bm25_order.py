"""The BM25 packing order of a training stream: on-disk cache and CLI.

``cached_bm25_order`` runs ``memjax.methods.trime.bm25.bm25_pack`` on a token stream
cut into segments and keeps the order on disk, keyed by the tokens and the
settings that change it. The offline entry point:

    python -m memjax.methods.trime.bm25_order --segments_npz=segments.npz \
        --batch_size=240 --out=order.npy [--k=20] [--seed=0]

Split over processes or machines (the search is the expensive part):

    python -m memjax.methods.trime.bm25_order --segments_npz=segments.npz \
        --num_shards=16 --shard_id=$i --out=neighbours_$i.npy  # i in 0..15
    python -m memjax.methods.trime.bm25_order \
        --neighbours=neighbours_0.npy,...,neighbours_15.npy --seed=0 \
        --out=order.npy
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from memjax.io import paths
from memjax.methods.trime.bm25 import _FORMAT_VERSION
from memjax.methods.trime.bm25 import bm25_neighbours
from memjax.methods.trime.bm25 import bm25_pack
from memjax.methods.trime.bm25 import pack_from_neighbours
from memjax.methods.trime.bm25 import split_segments


def _cache_key(tokens: np.ndarray, params: dict) -> str:
  h = hashlib.sha256()
  h.update(np.ascontiguousarray(tokens, np.int64).tobytes())
  h.update(json.dumps(params, sort_keys=True).encode())
  return h.hexdigest()[:32]


def order_params(
    tokens: np.ndarray,
    seq_len: int,
    k: int,
    seed: int,
    stopword_ids: Iterable[int] | None,
) -> dict:
  """The settings that change the packed order (not batch_size)."""
  stop = (
      sorted(int(t) for t in stopword_ids) if stopword_ids is not None else None
  )
  return {
      "version": _FORMAT_VERSION,
      "seq_len": int(seq_len),
      "k": int(k),
      "seed": int(seed),
      "stopword_ids": stop,
      "n": int(np.asarray(tokens).size),
  }


def order_key(
    tokens: np.ndarray,
    seq_len: int,
    k: int,
    seed: int,
    stopword_ids: Iterable[int] | None,
) -> str:
  """32 hex digits naming the packed order of these tokens and settings."""
  tokens = np.asarray(tokens).reshape(-1)
  return _cache_key(
      tokens, order_params(tokens, seq_len, k, seed, stopword_ids)
  )


def order_path(cache_dir: str | os.PathLike, key: str) -> str:
  """Where the order of ``key`` (``order_key``) is kept in ``cache_dir``."""
  return paths.join(
      paths.resolve(os.fspath(cache_dir)), f"bm25_order_{key}.npy"
  )


def read_cached(
    cache_dir: str | os.PathLike, key: str, num_segments: int
) -> np.ndarray | None:
  """The order of ``key`` kept in ``cache_dir``, or None when there is none
  (or it is unreadable: one warning line)."""
  path = order_path(cache_dir, key)
  return _read_order(path, num_segments) if paths.exists(path) else None


def save(cache_dir: str | os.PathLike, key: str, order: np.ndarray) -> None:
  """Keeps [S] ``order`` as the order of ``key`` in ``cache_dir``."""
  paths.makedirs(paths.resolve(os.fspath(cache_dir)))
  # Whole: concurrent writers leave one file.
  paths.np_save(order_path(cache_dir, key), order)


def segment_examples(
    order: np.ndarray, tokens: np.ndarray, seq_len: int
) -> Iterator[dict[str, Any]]:
  """The packed task's examples, one per segment in ``order`` [S].

  Yields:
    {'targets': int32 [<= L] the segment's tokens, 'segment_id': int64 its
    index in the stream, 'packed_position': int64 its place in the order}.
  """
  for position, segment in enumerate(np.asarray(order).tolist()):
    yield {
        "targets": np.asarray(
            tokens[segment * seq_len : (segment + 1) * seq_len], np.int32
        ),
        "segment_id": np.int64(segment),
        "packed_position": np.int64(position),
    }


def is_permutation(a: np.ndarray, n: int) -> bool:
  """Whether ``a`` is [n] and holds each of 0..n-1 once."""
  a = np.asarray(a)
  return a.shape == (n,) and np.array_equal(np.sort(a), np.arange(n))


def _read_order(path: str, num_segments: int) -> np.ndarray | None:
  """The cached order, or None (one warning line) when it is unreadable."""
  try:
    order = paths.np_load(path)
  except (ValueError, OSError, EOFError) as e:
    order, why = None, f"unreadable ({type(e).__name__})"
  else:
    ok = is_permutation(order, num_segments)
    why = "not a permutation of the segments"
  if order is None or not ok:
    logging.warning("BM25 order %s is %s: recomputing it", path, why)
    return None
  return order


def cached_bm25_order(
    tokens: np.ndarray,
    seq_len: int,
    batch_size: int,
    k: int = 20,
    seed: int = 0,
    cache_dir: str | os.PathLike = "~/.cache/memjax/bm25",
    *,
    stopword_ids: Iterable[int] | None = None,
    show_progress: bool = True,
    key: str | None = None,
) -> np.ndarray:
  """bm25_pack of a token stream cut into segments, cached on disk.

  The cache key is a hash of the tokens and the parameters that change the
  order (seq_len, k, seed, stop words; not batch_size, which does not).

  Args:
      tokens: [N] int token ids of the training stream.
      seq_len: L; segment i is tokens[i*L:(i+1)*L] (the last may be short).
      batch_size: B.
      k: BM25 hits per query.
      seed: seeds the random starts.
      cache_dir: where orders are kept as bm25_order_<hash>.npy.
      stopword_ids: token ids removed before indexing.
      show_progress: progress bars.
      key: ``order_key`` of these tokens and settings, where the caller
          has it already (hashing 100M tokens takes about a second).

  Returns:
      [ceil(N / L)] int64 order of the segments.
  """
  tokens = np.asarray(tokens).reshape(-1)
  params = order_params(tokens, seq_len, k, seed, stopword_ids)
  stop = params["stopword_ids"]
  key = key or _cache_key(tokens, params)
  order = read_cached(cache_dir, key, -(-tokens.size // seq_len))
  if order is not None:
    if show_progress:
      logging.info("BM25 order read from %s", order_path(cache_dir, key))
    return order
  order = bm25_pack(
      split_segments(tokens, seq_len),
      batch_size,
      k,
      seed,
      show_progress,
      stopword_ids=stop,
  )
  save(cache_dir, key, order)
  return order


def _load_segments(path: str, key: str | None) -> np.ndarray:
  with paths.np_load(path) as data:
    if key is None:
      if len(data.files) != 1:
        raise ValueError(
            f"{path} holds {data.files}; pass --key to choose one."
        )
      key = data.files[0]
    if key not in data.files:
      raise ValueError(f"{path} has no array {key!r}; it has {data.files}.")
    return data[key]


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
      description="BM25 packing of segments (TRIME Algorithm 1)."
  )
  parser.add_argument(
      "--segments_npz",
      default=None,
      help=".npz with an [S, L] int array of segments.",
  )
  parser.add_argument(
      "--key", default=None, help="array name in the .npz (if several)."
  )
  parser.add_argument(
      "--batch_size",
      type=int,
      default=1,
      help="B (the order does not depend on it; logged only).",
  )
  parser.add_argument("--k", type=int, default=20)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument(
      "--out", required=True, help="output .npy for the [S] order."
  )
  parser.add_argument("--no_progress", action="store_true")
  parser.add_argument(
      "--num_shards",
      type=int,
      default=1,
      help="with --shard_id: search one shard of the queries and "
      "write its [rows, k] neighbour table to --out.",
  )
  parser.add_argument("--shard_id", type=int, default=None)
  parser.add_argument(
      "--neighbours",
      default=None,
      help="comma-separated neighbour tables of all shards, in "
      "order: skip the search and pack from them.",
  )
  args = parser.parse_args(argv)
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
  out_dir = paths.dirname(paths.resolve(args.out))
  if args.neighbours:
    tables = args.neighbours.split(",")
    for path in tables:
      if not paths.exists(path):
        raise SystemExit(f"--neighbours: no such file {path}")
    order, restarts = pack_from_neighbours(
        np.concatenate([paths.np_load(p) for p in tables]), args.seed
    )
    logging.info("packed %d segments, %d random restarts", len(order), restarts)
    result = order
  else:
    if not paths.exists(args.segments_npz or ""):
      raise SystemExit(f"--segments_npz: no such file {args.segments_npz}")
    segments = _load_segments(args.segments_npz, args.key)
    if args.shard_id is not None:
      result = bm25_neighbours(
          segments,
          args.k,
          show_progress=not args.no_progress,
          shard=(args.shard_id, args.num_shards),
      )
    else:
      result = bm25_pack(
          segments,
          args.batch_size,
          args.k,
          args.seed,
          show_progress=not args.no_progress,
      )
  paths.makedirs(out_dir)
  paths.np_save(args.out, result)
  logging.info("wrote %s %s", args.out, result.shape)


if __name__ == "__main__":
  main()
