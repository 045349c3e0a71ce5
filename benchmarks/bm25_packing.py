"""Time of BM25 packing (TRIME Algorithm 1) against the number of segments.

Cases: the demo WikiText corpus at L = 150 (with and without English stop
words removed), and synthetic corpora of Zipfian token ids (vocabulary 50k,
L = 150) of growing size. Prints one JSON line per case as it finishes and a
final JSON summary with the machine and a power-law fit of time against S.

    python benchmarks/bm25_packing.py [--sizes=12500,25000,50000,100000] \
        [--beam_workers=2]

With --beam_workers=N (0: skip), the demo corpus is also packed through the
Beam pipeline (DirectRunner, N processes; ``pack_beam``) in the same run, and
both ways report CPU-seconds per segment searched (this process and its
children: wall time on busy cores says little about scaling) and CPU-hours
extrapolated to WikiText-103 (103M tokens, 690k segments of 150) with the
search's quadratic growth: cpu_s_per_segment * 690k * (690k / S).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import bm25s  # pylint: disable=g-import-not-at-top
import numpy as np

from benchmarks import harness  # pylint: disable=g-import-not-at-top
from memjax.methods.trime import bm25

DEMO_TRAIN = os.path.join(REPO, "demo_data", "wikitext", "wiki.train.tokens")
WT103_SEGMENTS = 690_000  # WikiText-103 train at L = 150 (103M tokens)


def wikitext_ids(path: str) -> tuple[np.ndarray, dict[str, int]]:
  """Word ids of a WikiText file: whitespace words plus <eos> per line,
  ids by descending frequency (a stand-in for the project's vocabulary)."""
  words = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      words.extend(line.split())
      words.append("<eos>")
  vocab, inverse, counts = np.unique(
      np.array(words), return_inverse=True, return_counts=True
  )
  rank = np.empty(len(vocab), np.int64)
  rank[np.argsort(-counts, kind="stable")] = np.arange(len(vocab))
  return rank[inverse].astype(np.int32), {
      w: int(rank[i]) for i, w in enumerate(vocab)
  }


def zipf_segments(
    num: int, length: int = 150, vocab: int = 50_000, seed: int = 0
) -> np.ndarray:
  rng = np.random.default_rng(seed)
  p = 1.0 / np.arange(1, vocab + 1)
  return rng.choice(vocab, size=(num, length), p=p / p.sum()).astype(np.int32)


def time_case(name: str, segments, k: int, stopword_ids=None) -> dict:
  segs = bm25._as_segment_list(segments)
  t0 = time.perf_counter()
  index = bm25._Index(segs, stopword_ids, None, 1.5, 0.75, show_progress=False)
  t1 = time.perf_counter()
  neighbours = np.full((len(segs), k), -1, np.int64)
  chunk = int(min(max(bm25._CHUNK_ENTRIES // len(segs), 16), 4096))
  for start in range(0, len(segs), chunk):
    rows = np.arange(start, min(start + chunk, len(segs)))
    neighbours[rows] = bm25._top_k_rows(index.scores(rows), k)
  t2 = time.perf_counter()
  order, restarts = bm25.pack_from_neighbours(neighbours, seed=0)
  t3 = time.perf_counter()
  assert np.array_equal(np.sort(order), np.arange(len(segs)))
  # Baseline in the same run: bm25s's own retrieve, one query at a time
  # (numpy backend), on the same index, for a sample of queries.
  sample = [index.remapped[i].tolist() for i in range(min(200, len(segs)))]
  index.retriever.retrieve(
      sample[:5], k=k, show_progress=False, backend_selection="numpy"
  )
  t4 = time.perf_counter()
  index.retriever.retrieve(
      sample, k=k, show_progress=False, backend_selection="numpy"
  )
  baseline_ms = (time.perf_counter() - t4) / len(sample) * 1e3
  return {
      "case": name,
      "segments": len(segs),
      "tokens": int(sum(len(s) for s in segs)),
      "dense_terms": int(len(index.dense_terms)),
      "index_s": round(t1 - t0, 2),
      "search_s": round(t2 - t1, 2),
      "pack_loop_s": round(t3 - t2, 2),
      "total_s": round(t3 - t0, 2),
      "search_ms_per_query": round((t2 - t1) / len(segs) * 1e3, 3),
      "bm25s_retrieve_ms_per_query": round(baseline_ms, 3),
      "speedup_vs_bm25s_retrieve": round(
          baseline_ms / ((t2 - t1) / len(segs) * 1e3), 2
      ),
      "random_restarts": int(restarts),
  }


def _cpu_s() -> float:
  """CPU seconds of this process and its finished children."""
  own = resource.getrusage(resource.RUSAGE_SELF)
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _per_segment(name: str, cpu_s: float, wall_s: float, num: int) -> dict:
  per = cpu_s / num
  return {
      "case": name,
      "segments": num,
      "cpu_s": round(cpu_s, 1),
      "wall_s": round(wall_s, 1),
      "cpu_s_per_segment": round(per, 5),
      "wt103_cpu_hours_quadratic": round(
          per * WT103_SEGMENTS * (WT103_SEGMENTS / num) / 3600, 1
      ),
  }


def cpu_cases(tokens: np.ndarray, seq_len: int, k: int, workers: int):
  """In-process and Beam packing of one stream: CPU-seconds per segment."""
  from memjax.methods.trime import pack_beam  # pylint: disable=g-import-not-at-top

  num = -(-len(tokens) // seq_len)
  c0, w0 = _cpu_s(), time.perf_counter()
  ref = bm25.bm25_pack(
      bm25.split_segments(tokens, seq_len), 1, k, 0, show_progress=False
  )
  rows = [
      _per_segment("in_process", _cpu_s() - c0, time.perf_counter() - w0, num)
  ]
  settings = pack_beam.PackSettings(seq_len, k, 0)
  with tempfile.TemporaryDirectory() as tmp:
    out = pack_beam.task_dir(tmp, "memjax_bm25_benchmark")
    c0, w0 = _cpu_s(), time.perf_counter()
    pack_beam.run(tokens, settings, out, runner="DirectRunner", workers=workers)
    row = _per_segment(
        f"beam_direct_{workers}_workers",
        _cpu_s() - c0,
        time.perf_counter() - w0,
        num,
    )
    task = pack_beam.register_task(
        "memjax_bm25_benchmark", tokens, settings, tmp
    )
    order = pack_beam.read_order(task, num, out)
  row["same_order_as_in_process"] = bool(np.array_equal(order, ref))
  return rows + [row]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--sizes", default="12500,25000,50000,100000")
  parser.add_argument("--k", type=int, default=20)
  parser.add_argument("--seq_len", type=int, default=150)
  parser.add_argument("--beam_workers", type=int, default=2)
  args = parser.parse_args()
  # No JAX program runs here: the machine without JAX's devices.
  machine = {**harness.machine(devices=False), "bm25s": bm25s.__version__}
  rows = []

  def report(row):
    rows.append(row)
    print(json.dumps(row), flush=True)

  if os.path.exists(DEMO_TRAIN):
    tokens, vocab = wikitext_ids(DEMO_TRAIN)
    segs = bm25.split_segments(tokens, args.seq_len)
    report(time_case("demo_wikitext", segs, args.k))
    stop = [vocab[w] for w in bm25s.stopwords.STOPWORDS_EN if w in vocab]
    report(
        time_case("demo_wikitext_en_stopwords", segs, args.k, stopword_ids=stop)
    )
    if args.beam_workers:
      for row in cpu_cases(tokens, args.seq_len, args.k, args.beam_workers):
        report(row)
  for num in (int(s) for s in args.sizes.split(",") if s):
    report(time_case(f"zipf_{num}", zipf_segments(num, args.seq_len), args.k))

  zipf = [r for r in rows if r["case"].startswith("zipf_")]
  fit = {}
  if len(zipf) >= 2:
    x = np.log([r["segments"] for r in zipf])
    y = np.log([r["total_s"] for r in zipf])
    slope, intercept = np.polyfit(x, y, 1)
    fit = {
        "time_exponent": round(float(slope), 2),
        "extrapolated_total_s_at_690k": round(
            float(math.exp(intercept) * WT103_SEGMENTS**slope)
        ),
        "note": "total_s ~ c * S^exponent fitted on the zipf cases",
    }
  print(
      json.dumps(
          {
              "machine": machine,
              "k": args.k,
              "seq_len": args.seq_len,
              "results": rows,
              "fit": fit,
          },
          indent=2,
      )
  )


if __name__ == "__main__":
  main()
