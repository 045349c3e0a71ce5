"""Transformer-XL and Transformer+RPE (LaMemo paper, Tables 1-2).

Usage: ``--config=configs/txl_wt103.py:VARIANT`` with VARIANT = SIZE or
METHOD_SIZE:

* SIZE: ``smoke`` (seconds on a CPU), ``demo`` (minutes on a CPU, demo
  corpus), ``base`` (the paper's WikiText-103 model: 16 layers, 10 heads x
  41, FFN 2100, adaptive input and softmax, target and memory length 150),
  ``enwik8`` and ``text8`` (12 layers, 8 heads x 64, FFN 2048, target and
  memory length 512, bytes), ``char_gpu`` (the recurrent comparison sized
  for one GPU: bytes of the shipped enwik8 demo corpus, 8 layers, 8 heads x
  64, FFN 2048, segment = memory = 256; ``python -m memjax.demos.lamemo
  --size=char_gpu``).
* METHOD: ``txl`` (default; Transformer-XL, recurrent memory of mem_len
  normed layer inputs per layer) or ``rpe`` (Transformer+RPE: the same
  relative-position attention, disentangled, without memory; evaluated with
  sliding windows of one training segment).

Training (LaMemo paper, App. C): Adam 2.5e-4 without warm-up, cosine decay to
0, gradient clipping 0.25, dropout 0.1, no attention dropout; WikiText-103:
250k steps of 64 segments; enwik8 / text8: 100k steps of 40. Batches are
Transformer-XL's lanes of consecutive segments (``data.batching =
'consecutive'``, one segment per lane and step), for every method so that
all see the same data in the same order.

``configs/lamemo_wt103.py`` builds on ``recurrent_config`` below.
"""

from __future__ import annotations

from typing import Any, Optional

from memjax import config as base

SIZES = ("smoke", "demo", "base", "enwik8", "text8", "char_gpu")
METHODS = ("txl", "rpe")


def recurrent_config(
    size: str,
    attention: str,
    options: Optional[dict[str, Any]] = None,
    name: str = "",
):
  """The config of a relative-attention model of ``size``.

  Args:
    size: one of SIZES.
    attention: 'rpe' (no memory), 'xl' or 'lamemo'.
    options: ``model.attention_options`` (e.g. LaMemo's switches).
    name: run name (default ``<corpus>_<attention>_<size>``).

  Returns:
    An ml_collections ConfigDict.
  """
  if size not in SIZES:
    raise ValueError(f"unknown size {size!r}; use one of {SIZES}")
  c = base.base_config()
  m, d, o, t, e = c.model, c.data, c.optim, c.train, c.eval
  base.use_kinds(c, attention=attention)  # Every option filled in.
  for k, v in (options or {}).items():
    m.attention_options[k] = v
  d.corpus = {"text8": "text8", "enwik8": "enwik8", "char_gpu": "enwik8"}.get(
      size, "wikitext103"
  )
  d.batching = "consecutive"
  d.segments_per_lane = 1
  m.dropout, m.attention_dropout = 0.1, 0.0
  o.optimizer, o.schedule, o.warmup_steps = "adam", "cosine", 0
  o.b1, o.b2 = 0.9, 0.999
  o.clip_norm = 0.25

  if size == "smoke":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 2, 32, 2, 16, 64
    m.cutoffs = (1000, 4000)
    d.seq_len, d.batch_size, mem = 16, 8, 16
    o.learning_rate, o.warmup_steps = 2e-3, 5
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = 20, 5, 10, 10
    t.eval_max_windows = 8
    e.lanes, e.max_windows = 2, 16
    e.window_len, e.score_len, e.batch_size = 16, 8, 16
  elif size == "demo":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        4,
        128,
        4,
        32,
        512,
    )
    m.cutoffs = (2000, 6000)
    d.seq_len, d.batch_size, mem = 64, 8, 64
    o.learning_rate, o.warmup_steps = 2e-3, 50
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = 800, 50, 0, 400
    e.lanes = 8
    e.window_len, e.score_len, e.batch_size = 64, 32, 64
  elif size == "base":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        16,
        410,
        10,
        41,
        2100,
    )
    m.cutoffs = (20000, 40000, 200000)
    m.adaptive_factor = 1  # Transformer-XL's div_val 1: full-width clusters.
    d.seq_len, d.batch_size, mem = 150, 64, 150
    o.learning_rate = 2.5e-4
    t.num_steps = 250000
    e.lanes = 10  # Transformer-XL's evaluation batch.
    e.window_len, e.score_len, e.batch_size = 150, 75, 64
  elif size == "char_gpu":
    # Context beyond ~32 tokens buys nothing in the CPU demo, so memory
    # cannot win there. This size gives memory room to matter at character
    # level (segment = memory = 256 bytes, 8 layers) while staying within
    # the 1.5 MB shipped training split: 6,000 steps of 22 x 256 bytes are
    # about 22 epochs, hence dropout 0.2. Sized for one GPU (about 20
    # minutes for the three rows of the recurrent demo).
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        8,
        512,
        8,
        64,
        2048,
    )
    m.cutoffs = ()
    m.dropout = 0.2
    d.seq_len, d.batch_size, mem = 256, 22, 256
    o.learning_rate, o.warmup_steps = 5e-4, 200
    t.num_steps, t.log_every, t.eval_every = 6000, 200, 0
    t.checkpoint_every = 2000
    e.lanes = 8
    e.window_len, e.score_len, e.batch_size = 256, 128, 32
  else:  # enwik8, text8
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        12,
        512,
        8,
        64,
        2048,
    )
    m.cutoffs = ()
    d.seq_len, d.batch_size, mem = 512, 40, 512
    o.learning_rate = 2.5e-4
    t.num_steps = 100000
    e.lanes = 10
    e.window_len, e.score_len, e.batch_size = 512, 256, 16

  if size in ("base", "enwik8", "text8"):
    # Layers scanned: faster to compile and no more memory than unscanned
    # (benchmarks/compile_time.py; docs/plan.md).
    m.scan_layers = True
    t.log_every, t.eval_every, t.checkpoint_every = 100, 5000, 5000
    t.eval_max_windows = 200
    t.keep_checkpoints = 3
  m.mem_len = 0 if attention == "rpe" else mem
  m.max_len = max(m.max_len, d.seq_len, e.window_len)
  # Relative positions add no table to the embeddings, so the handicap of
  # unscaled embeddings under absolute positions does not arise; these
  # configs keep them unscaled as they were trained so far (Transformer-XL's
  # AdaptiveEmbedding multiplies by sqrt(d_proj): switching changes the
  # recurrent demo's numbers and needs that demo re-run).
  m.scale_embedding = False
  if size in ("base", "enwik8", "text8"):
    # The authors' scripts: Transformer-XL's pre_lnorm=False (post-LN, no
    # final LayerNorm) and PyTorch's LayerNorm epsilon. Smoke and demo keep
    # pre-LN.
    m.norm_position = "post"
    m.norm_epsilon = 1e-5
  c.name = name or f"{d.corpus}_{attention}_{size}"
  return c


def get_config(arg: str = "demo"):
  method, size = base.parse_variant(arg, SIZES, METHODS)
  attention = {"txl": "xl", "rpe": "rpe"}[method]
  return recurrent_config(size, attention)
