"""Retrieval-augmented causal LM (modified MARGE) on WikiText-103.

Usage: ``--config=configs/marge_wt103.py:VARIANT`` with VARIANT = SIZE or
METHOD_SIZE:

* SIZE: ``smoke`` (seconds on a CPU), ``planted`` (the smoke-sized model
  of the planted-corpus test, tests/test_marge_planted.py: N = 4, d = 64,
  no dropout, a full word softmax, beta starting at 0, re-indexing every 20
  of 300 steps; the test supplies ``data.data_dir``), ``demo`` (minutes on
  a CPU, demo corpus), ``wt103`` (a WikiText-103-sized run: 16 layers,
  N = 64).
* METHOD: ``marge`` (default): the 'marge' family and batcher with the
  ``marge_reindex`` step hook; ``vanilla``: the plain LM of the same size
  and window (2N tokens, loss on every position), the baseline.

See docs/marge.md for the design choices and their switches
(``model.family_options``: segment_len, num_sources, cross_layers, pooling,
beta_init, embed_gradient; ``marge``: same_doc_steps, sub_batch,
search).
"""

import ml_collections

from memjax import config as base

SIZES = ("smoke", "planted", "demo", "wt103")
METHODS = ("marge", "vanilla")


def _size(c, size: str) -> tuple[int, int]:
  """Sets the model, batch and schedule of ``size``; returns (N, every)."""
  m, d, o, t, e = c.model, c.data, c.optim, c.train, c.eval
  if size == "smoke":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 2, 32, 2, 16, 64
    m.cutoffs = (1000, 4000)
    n, d.batch_size = 8, 8
    o.learning_rate, o.warmup_steps = 2e-3, 5
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = 8, 4, 8, 8
    t.eval_max_windows = 8
    e.window_len, e.score_len, e.batch_size, e.max_windows = 16, 8, 16, 16
    return n, 4
  if size == "planted":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 2, 64, 4, 16, 128
    m.cutoffs, m.dropout = (), 0.0
    n, d.batch_size = 4, 32
    o.learning_rate, o.warmup_steps, o.schedule = 3e-3, 5, "constant"
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = (
        300,
        100,
        0,
        300,
    )
    e.splits, e.window_len, e.score_len, e.batch_size = ("test",), 16, 8, 16
    return n, 20
  if size == "demo":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        4,
        128,
        4,
        32,
        512,
    )
    m.cutoffs = (2000, 6000)
    m.dropout = 0.1
    n, d.batch_size = 32, 16
    o.learning_rate, o.warmup_steps, o.schedule = 2e-3, 50, "cosine"
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = (
        400,
        50,
        400,
        400,
    )
    e.window_len, e.score_len, e.batch_size = 64, 32, 64
    return n, 100
  m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
      16,
      1024,
      8,
      128,
      4096,
  )
  m.cutoffs = (20000, 60000)
  m.dropout = 0.3
  n, d.batch_size = 64, 64
  # Layers scanned: faster to compile and no more memory than unscanned
  # (benchmarks/compile_time.py; docs/plan.md).
  m.scan_layers = True
  o.learning_rate, o.warmup_steps, o.schedule = 5e-4, 4000, "cosine"
  t.num_steps = 200000
  e.window_len, e.score_len, e.batch_size = 128, 64, 32
  return n, 10000


def get_config(arg: str = "demo"):
  method, size = base.parse_variant(arg, SIZES, METHODS)
  c = base.base_config()
  c.name = f"wt103_{method}_{size}"
  c.data.corpus = "wikitext103"
  n, every = _size(c, size)
  c.data.seq_len = 2 * n
  if method == "vanilla":
    return c
  small = size in ("smoke", "planted")
  k = 2 if small else 4
  c.model.family = "marge"
  c.model.family_options = ml_collections.ConfigDict(
      dict(
          segment_len=n,
          num_sources=k,
          pooling="mean",
          # The planted test shows that beta grows from 0.
          beta_init=0.0 if size == "planted" else 1.0,
          embed_gradient=True,
      )
  )
  c.data.batching = "marge"
  c.marge.same_doc_steps = 0 if size == "planted" else every // 2
  c.marge.sub_batch = 4
  c.marge.search = "scann" if size == "wt103" else "exact"
  c.train.hooks = ("marge_reindex",)
  c.train.hook_options.marge_reindex = ml_collections.ConfigDict(
      dict(every=every, probes=16 if size == "planted" else 256, batch=256)
  )
  return c
