"""WikiText-103 language models (TRIME paper, Tables 2-3 and 9).

Usage: ``--config=configs/trime_wt103.py:VARIANT`` with VARIANT = SIZE or
METHOD_SIZE:

* SIZE: ``smoke`` (seconds on a CPU), ``demo`` (minutes on a CPU, demo
  corpus), ``247m``, ``150m``, ``7m`` (the paper's sizes, Table 9).
* METHOD: ``vanilla`` (default; the plain LM objective).

Dropout values are not in Table 9; those below follow Baevski & Auli (247M)
and Transformer-XL (150M).
"""

from memjax import config as base

SIZES = ("smoke", "demo", "247m", "150m", "7m")
METHODS = ("vanilla",)


def get_config(arg: str = "demo"):
  method, size = base.parse_variant(arg, SIZES, METHODS)
  c = base.base_config()
  c.name = f"wt103_{method}_{size}"
  c.data.corpus = "wikitext103"
  m, d, o, t, e = c.model, c.data, c.optim, c.train, c.eval

  if size == "smoke":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 2, 32, 2, 16, 64
    m.cutoffs = (1000, 4000)
    d.seq_len, d.batch_size = 32, 8
    o.learning_rate, o.warmup_steps = 2e-3, 5
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = 20, 5, 10, 10
    t.eval_max_windows = 8
    e.window_len, e.score_len, e.batch_size, e.max_windows = 32, 16, 16, 32
  elif size == "demo":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 4, 128, 4, 32, 512
    m.cutoffs = (2000, 6000)
    m.dropout = 0.1
    d.seq_len, d.batch_size = 128, 16
    o.learning_rate, o.warmup_steps, o.schedule = 2e-3, 50, "cosine"
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = 800, 50, 400, 400
    e.window_len, e.score_len, e.batch_size = 128, 64, 64
  elif size == "247m":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 16, 1024, 8, 128, 4096
    m.cutoffs = (20000, 60000)
    m.scale_embedding = True
    m.dropout, m.attention_dropout = 0.3, 0.1
    m.remat = True
    d.seq_len, d.batch_size = 3072, 24
    t.grad_accum = 3
    o.optimizer, o.learning_rate, o.momentum = "nag", 1.0, 0.99
    o.schedule, o.warmup_steps, o.clip_norm = "cosine", 16000, 0.1
    o.min_lr_ratio = 1e-4
    t.num_steps = 286000
    e.window_len, e.score_len, e.batch_size = 3072, 512, 8
  elif size == "150m":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 16, 410, 10, 41, 2100
    m.cutoffs = (20000, 40000, 200000)
    m.dropout = 0.1
    d.seq_len, d.batch_size = 150, 240
    t.grad_accum = 4
    o.optimizer, o.learning_rate, o.schedule, o.warmup_steps = "adam", 2.5e-4, "cosine", 0
    t.num_steps = 400000
    e.window_len, e.score_len, e.batch_size = 150, 64, 64
  elif size == "7m":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = 8, 128, 4, 32, 512
    m.cutoffs = (20000, 60000)
    m.dropout = 0.1
    d.seq_len, d.batch_size = 3072, 8
    o.optimizer, o.learning_rate = "adam", 5e-4
    o.schedule, o.warmup_steps = "inverse_sqrt", 8000
    t.num_steps = 200000
    e.window_len, e.score_len, e.batch_size = 3072, 512, 8

  if size in ("247m", "150m", "7m"):
    t.log_every, t.eval_every, t.checkpoint_every = 100, 5000, 5000
    t.keep_checkpoints = 3
  m.max_len = max(m.max_len, d.seq_len, e.window_len)
  return c
