"""WikiText-103 language models (TRIME paper, Tables 2-3 and 9).

Usage: ``--config=configs/trime_wt103.py:VARIANT`` with VARIANT = SIZE or
METHOD_SIZE:

* SIZE: ``smoke`` (seconds on a CPU), ``demo`` (minutes on a CPU, demo
  corpus), ``247m``, ``150m``, ``7m`` (the paper's sizes, Table 9).
* METHOD (TRIME paper, Tables 1-3 and 9):

  - ``vanilla`` (default): the plain LM objective, random segments. Its
    ``--mode=tune`` tunes the continuous-cache baseline (lambda, theta, and
    the long-term memory size: 0 or Table 9's).
  - ``trime``: TRIMELM, the TRIME loss with the local memory, random
    segments; evaluated with M_local (tau tuned on valid).
  - ``trime_long``: TRIMELM_long, b random blocks of m consecutive segments
    per batch (m from Table 9's "#Consecutive segments"), long-term in-batch
    memory; evaluated with M_local u M_long (Table 9's "#Optimal long-term
    memories" by default; ``--mode=tune`` also tries 0 and half of it).
  - ``trime_ext``: TRIMELM_ext, BM25-packed batches (k = 20, m = 1), memory
    = the other segments plus the local memory, hidden with p = 0.9 per
    step; evaluated with M_local u M_long, and with the external memory
    (``--config.eval_memory.kind=trime_ext`` after ``--mode=datastore`` and
    ``--mode=index``: K = 1,024 neighbours, tau = 1.25, tau' = 10.5,
    lambda = 0.3 by default, tuned by ``--mode=tune``).

  ``vanilla`` is evaluated with kNN-LM by ``--config.eval_memory.kind=knn``
  on its own datastore (``external.external_kind`` names the external
  kind of each method).

Every method keeps Table 9's model, batch, segment length and optimiser of
its size, so the rows of a size differ only in the objective and batching.
Dropout values are not in Table 9; those below follow Baevski & Auli (247M)
and Transformer-XL (150M).
"""

from memjax import config as base

SIZES = ("smoke", "demo", "247m", "150m", "7m")
METHODS = ("vanilla", "trime", "trime_long", "trime_ext")

# Per size: (m consecutive segments per lane for trime_long, long-term memory
# tokens at evaluation), Table 9 for the paper's sizes.
MEMORY = {
    "smoke": (4, 64),
    "demo": (4, 1024),
    "247m": (4, 12288),
    "150m": (60, 15000),
    "7m": (8, 12288),
}


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
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        4,
        128,
        4,
        32,
        512,
    )
    m.cutoffs = (2000, 6000)
    m.dropout = 0.1
    d.seq_len, d.batch_size = 128, 16
    o.learning_rate, o.warmup_steps, o.schedule = 2e-3, 50, "cosine"
    # 400 steps keep `make demo` (three trainings and the tuning) at about
    # ten minutes on two idle CPU cores.
    t.num_steps, t.log_every, t.eval_every, t.checkpoint_every = (
        400,
        50,
        400,
        400,
    )
    e.window_len, e.score_len, e.batch_size = 128, 64, 64
  elif size == "247m":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        16,
        1024,
        8,
        128,
        4096,
    )
    m.cutoffs = (20000, 60000)
    m.scale_embedding = True
    m.dropout, m.attention_dropout = 0.3, 0.1
    # fairseq's transformer_lm_wiki103 (Baevski & Auli): no final decoder
    # LayerNorm, activation dropout 0.1 and adaptive-softmax dropout 0.2
    # (inside the tail clusters).
    m.final_layer_norm = False
    m.feed_forward_options.activation_dropout = 0.1
    m.adaptive_dropout = 0.2
    m.remat = True
    d.seq_len, d.batch_size = 3072, 24
    t.grad_accum = 3
    o.optimizer, o.learning_rate, o.momentum = "nag", 1.0, 0.99
    o.schedule, o.warmup_steps, o.clip_norm = "cosine", 16000, 0.1
    o.min_lr_ratio = 1e-4
    t.num_steps = 286000
    e.window_len, e.score_len, e.batch_size = 3072, 512, 8
  elif size == "150m":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        16,
        410,
        10,
        41,
        2100,
    )
    m.cutoffs = (20000, 40000, 200000)
    m.dropout = 0.1
    d.seq_len, d.batch_size = 150, 240
    t.grad_accum = 4
    o.optimizer, o.learning_rate, o.schedule, o.warmup_steps = (
        "adam",
        2.5e-4,
        "cosine",
        0,
    )
    t.num_steps = 400000
    e.window_len, e.score_len, e.batch_size = 150, 64, 64
  elif size == "7m":
    m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
        8,
        128,
        4,
        32,
        512,
    )
    m.cutoffs = (20000, 60000)
    m.dropout = 0.1
    d.seq_len, d.batch_size = 3072, 8
    o.optimizer, o.learning_rate = "adam", 5e-4
    o.schedule, o.warmup_steps = "inverse_sqrt", 8000
    t.num_steps = 200000
    e.window_len, e.score_len, e.batch_size = 3072, 512, 8

  if size in ("247m", "150m", "7m"):
    # Layers scanned: faster to compile and no more memory than unscanned
    # (benchmarks/compile_time.py; docs/plan.md).
    m.scan_layers = True
    t.log_every, t.eval_every, t.checkpoint_every = 100, 5000, 5000
    t.keep_checkpoints = 3
    # fairseq's transformer_lm_wiki103 is pre-LN; PyTorch's LayerNorm eps.
    m.norm_epsilon = 1e-5
  m.max_len = max(m.max_len, d.seq_len, e.window_len)
  apply_method(c, method, *MEMORY[size])
  if size == "smoke":
    c.eval_memory.sweep_tokens = (0, 32, 64, 128)
    c.eval_memory.batch_size = 4
  elif size == "demo":
    c.eval_memory.sweep_tokens = (0, 256, 512, 1024, 2048, 4096, 8192)
    c.eval_memory.batch_size = 16
    if method in ("vanilla", "trime_long"):
      c.eval_memory.long_mem_grid = (0, 1024, 2048, 4096)
  return c


def apply_method(c, method: str, segments_per_lane: int, long_mem: int) -> None:
  """Sets the objective, batching and evaluation memory of a method.

  Args:
    c: the config of a size (modified in place).
    method: one of METHODS.
    segments_per_lane: m, consecutive segments per block (trime_long).
    long_mem: long-term memory tokens at evaluation (Table 9).
  """
  em = c.eval_memory
  if method == "vanilla":
    em.kind = "cache"
    c.external.external_kind = "knn"
    em.long_mem_tokens = 0
    em.long_mem_grid = (0, long_mem)
    return
  c.loss.name = "trime"
  em.kind = "trime"
  if method == "trime":
    c.trime.memory = "local"
    em.long_mem_tokens = 0
  elif method == "trime_long":
    c.trime.memory = "long"
    c.data.batching = "blocks"
    c.data.segments_per_lane = segments_per_lane
    em.long_mem_tokens = long_mem
    em.long_mem_grid = (0, long_mem // 2, long_mem)
  elif method == "trime_ext":
    c.external.external_kind = "trime_ext"
    c.trime.temperature = 1.25  # the authors' 247M TRIMELM_ext setting
    c.trime.memory = "external"
    c.trime.local_hide_prob = 0.9
    c.data.batching = "bm25"
    c.trime.bm25_k = 20
    c.data.segments_per_lane = 1
    em.long_mem_tokens = long_mem
    em.long_mem_grid = (0, long_mem // 2, long_mem)
  else:
    raise ValueError(f"unknown method {method!r}; use one of {METHODS}")
