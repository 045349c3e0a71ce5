"""Character-level models on enwik8 or text8 (TRIME paper, Table 4 and 9).

Usage: ``--config=configs/trime_enwik8.py:VARIANT`` with VARIANT = SIZE or
METHOD_SIZE, SIZE in ``smoke``, ``demo``, ``38m``, METHOD in ``vanilla``,
``trime``, ``trime_long``, ``trime_ext`` (as in ``configs/trime_wt103.py``;
Table 4 has vanilla, + continuous cache, TRIMELM and TRIMELM_long, with
m = 24 consecutive segments and a 24,576-token long-term memory for 38M).
Add ``--config.data.corpus=text8`` for text8 (same model, same bytes
vocabulary). Byte vocabulary: no adaptive softmax. BM25 over bytes
(trime_ext) treats each byte as a term.
"""

import importlib.util
import os

from memjax import config as base

# The sibling file, loaded by path: this file is itself loaded by path (from
# the checkout's configs/ or the copy installed as memjax/configs).
_spec = importlib.util.spec_from_file_location(
    "trime_wt103", os.path.join(os.path.dirname(__file__), "trime_wt103.py")
)
trime_wt103 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trime_wt103)

SIZES = ("smoke", "demo", "38m")
METHODS = trime_wt103.METHODS

# (m consecutive segments for trime_long, long-term memory tokens at eval).
MEMORY = {
    "smoke": (4, 128),
    "demo": (4, 2048),
    "38m": (24, 24576),
}


def get_config(arg: str = "demo"):
  method, size = base.parse_variant(arg, SIZES, METHODS)
  c = base.base_config()
  c.name = f"enwik8_{method}_{size}"
  c.data.corpus = "enwik8"
  m, d, o, t, e = c.model, c.data, c.optim, c.train, c.eval
  m.cutoffs = ()
  m.scale_embedding = True

  if size == "smoke":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 2, 32, 2, 16, 64
    d.seq_len, d.batch_size = 64, 8
    o.learning_rate, o.warmup_steps = 2e-3, 5
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = 20, 5, 10, 10
    t.eval_max_windows = 8
    e.window_len, e.score_len, e.batch_size, e.max_windows = 64, 32, 16, 32
  elif size == "demo":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        4,
        128,
        4,
        32,
        512,
    )
    d.seq_len, d.batch_size = 256, 16
    o.learning_rate, o.warmup_steps = 1e-3, 100
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = (
        1000,
        100,
        500,
        500,
    )
    e.window_len, e.score_len, e.batch_size, e.max_windows = 256, 128, 64, 0
  elif size == "38m":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        12,
        512,
        8,
        64,
        2048,
    )
    m.dropout = 0.1
    d.seq_len, d.batch_size = 512, 96
    t.grad_accum = 4
    o.optimizer, o.learning_rate, o.schedule, o.warmup_steps = (
        "adam",
        2.5e-4,
        "cosine",
        0,
    )
    t.num_steps = 400000
    t.log_every, t.eval_every, t.checkpoint_every = 100, 5000, 5000
    e.window_len, e.score_len, e.batch_size = 512, 80, 32
    m.norm_epsilon = 1e-5  # PyTorch's LayerNorm epsilon; pre-LN kept.
    # Layers scanned: faster to compile and no more memory than unscanned
    # (benchmarks/compile_time.py; docs/plan.md).
    m.scan_layers = True
  m.max_len = max(m.max_len, d.seq_len, e.window_len)
  trime_wt103.apply_method(c, method, *MEMORY[size])
  if size == "smoke":
    c.eval_memory.sweep_tokens = (0, 64, 128, 256)
    c.eval_memory.batch_size = 4
  elif size == "demo":
    c.eval_memory.sweep_tokens = (0, 512, 1024, 2048, 4096)
  else:
    c.eval_memory.sweep_tokens = (0, 3072, 6144, 12288, 24576)
  return c
