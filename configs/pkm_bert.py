"""BERT-style encoders with product-key memory (Kim & Jung 2020).

Usage: ``--config=configs/pkm_bert.py:METHOD_SIZE`` (METHOD optional:
``vanilla``). SIZE: ``smoke`` (tests), ``demo`` (4 layers, d 64, the demo
corpus), ``6l`` (6 layers, d 768, memory at 2 and 4), ``base`` (BERT-base:
12 layers, d 768, memory at 4 and 8, batch 1,024 x 512, Adam 1e-4, linear
warm-up 10k, 500k steps). METHOD, masked-LM pretraining (task 'mlm'):

* ``vanilla``: no memory (row (a); with ``--config.train.init_from=<(a)>``
  the extra-steps control, row (b));
* ``pkm``, ``resm``: memory layers from scratch (rows (c), (d));
* ``init_pkm``, ``init_resm``: the same, meant to start from a memory-less
  run (``--config.train.init_from=<(a)>``; rows (e), (f)): every shared
  parameter is restored; ``init_resm`` also maps each residual memory
  layer's FFN ('layer_i/ffn/dense/...') to the source's FFN of that layer
  ('layer_i/ffn/...'), ``init_pkm`` leaves those FFNs out (the memory
  replaces them);
* ``init_resm_fresh_ffn``: ResM' of Figure 3, the FFN of the memory layers
  re-initialised.

Fine-tuning on sentence classification (task 'classification', start from
a pretrained run with ``--config.train.init_from``): ``cls`` (no memory),
``cls_pkm``, ``cls_resm``, and ``cls_pkm_frozen``, ``cls_resm_frozen``
with the memory's keys and values held fixed (Table 5). Table 3's GLUE
settings at the paper sizes: lr 2e-5, batch 32, 10 epochs, warm-up 6%,
weight decay 0.1, length 128.

The feed-forward uses GELU, as BERT does (``model.activation``).

Memory: the paper's 512^2 slots, 4 heads, k = 32, k_dim 256 at 6l and base;
64^2 at demo size; 8^2 at smoke. The query is normalised by a BatchNorm
over the batch's real tokens, as in the paper (its running mean and
variance are carried by the train state and used in evaluation);
``--config.model.feed_forward_options.query_norm=layer`` gives the
LayerNorm of runs written before. Values are trained by lazy Adam at 1e-3
(Lample et al.) in their own group.
"""

import os

import ml_collections

from memjax import config as base
from memjax.data import sources

SIZES = ("smoke", "demo", "6l", "base")
MLM_METHODS = (
    "vanilla",
    "pkm",
    "resm",
    "init_pkm",
    "init_resm",
    "init_resm_fresh_ffn",
)
CLS_METHODS = (
    "cls",
    "cls_pkm",
    "cls_resm",
    "cls_pkm_frozen",
    "cls_resm_frozen",
)
METHODS = MLM_METHODS + CLS_METHODS

# Per size: layers, d_model, heads, head_dim, d_ff, seq_len, batch, steps,
# learning rate, warm-up, vocabulary pieces.
MODEL = {
    "smoke": (2, 32, 2, 16, 64, 32, 16, 4, 1e-3, 0, 1000),
    "demo": (4, 64, 2, 32, 256, 64, 32, 200, 1e-3, 20, 8000),
    "6l": (6, 768, 12, 64, 3072, 512, 1024, 500_000, 1e-4, 10_000, 30000),
    "base": (12, 768, 12, 64, 3072, 512, 1024, 500_000, 1e-4, 10_000, 30000),
}
# Per size: (num_keys C, heads, topk k, k_dim).
MEMORY = {
    "smoke": (8, 2, 2, 8),
    "demo": (64, 2, 8, 32),
    "6l": (512, 4, 32, 256),
    "base": (512, 4, 32, 256),
}
# Fine-tuning per size: (lr, batch, epochs, training examples). The paper
# sizes count SST-2's 67,349 training sentences; demo: the shipped 3,000,
# 2 epochs at a higher rate (a small model pretrained briefly).
FINETUNE = {
    "smoke": (1e-3, 16, 1, 64),
    "demo": (1e-3, 32, 2, 3000),
    "6l": (2e-5, 32, 10, 67349),
    "base": (2e-5, 32, 10, 67349),
}
# The memory values: per layer, or the one table of shared_values.
VALUES = "/ffn/memory/values$|^ffn_shared/values$"
FROZEN = "/ffn/memory/(values|keys)$|^ffn_shared/values$"


def memory_layers(num_layers: int) -> tuple[int, ...]:
  """Two memory layers at regular intervals, 1-based: {4, 8} of 12."""
  a, b = -(-num_layers // 3), -(-2 * num_layers // 3)
  return tuple(sorted({max(a, 1), max(b, 1)}))


def get_config(arg: str = "demo"):
  method, size = base.parse_variant(arg, SIZES, METHODS)
  c = base.base_config()
  c.name = f"bert_{method}_{size}"
  layers, d, h, hd, ff, seq, batch, steps, lr, warm, vocab = MODEL[size]
  m = c.model
  m.family = "encoder"
  m.num_layers, m.d_model, m.num_heads, m.head_dim, m.d_ff = (
      layers,
      d,
      h,
      hd,
      ff,
  )
  m.max_len = seq
  m.norm_position = "post"  # BERT
  m.norm_epsilon = 1e-12
  # BERT's feed-forward and MLM head: the exact (erf) GELU of HuggingFace's
  # BERT, which Kim & Jung built on ('gelu_tanh': Google's original).
  m.activation = "gelu"
  m.dropout = 0.0 if size == "smoke" else 0.1
  m.attention_dropout = m.dropout
  m.cutoffs = ()
  c.mlm.vocab_size = vocab
  c.optim.optimizer = "adam"
  c.optim.learning_rate = lr
  c.optim.schedule = "linear"
  c.optim.warmup_steps = warm
  c.optim.b2 = 0.999
  c.optim.eps = 1e-6
  c.optim.weight_decay = 0.01
  c.optim.clip_norm = 1.0
  c.eval.batch_size = 32
  c.eval.splits = ("valid", "test")
  c.eval.max_windows = {"smoke": 64, "demo": 256}.get(size, 0)
  c.train.num_steps = steps
  c.train.log_every = min(50, steps)
  c.train.eval_every = 0
  c.train.eval_max_windows = 64
  c.train.checkpoint_every = steps
  c.train.keep_checkpoints = 1
  if method in MLM_METHODS:
    c.task = "mlm"
    c.data.batching = "mlm"
    c.data.seq_len, c.data.batch_size = seq, batch
  else:
    _finetune(c, size)
  kind = next((k for k in ("pkm", "resm") if k in method.split("_")), "")
  if kind:
    _memory(c, kind, *MEMORY[size], frozen=method.endswith("_frozen"))
  if method == "init_resm":
    c.train.init_from_map = tuple(
        rf"^(layer_{i - 1}/ffn)/dense/=\1/" for i in m.feed_forward_layers
    )
  return c


def _finetune(c: ml_collections.ConfigDict, size: str) -> None:
  lr, batch, epochs, n_train = FINETUNE[size]
  c.task = "classification"
  c.model.family_options.head = "classify"
  c.model.family_options.num_classes = 2
  c.data.batching = "sentences"
  c.data.batch_size = batch
  c.data.seq_len = 128
  # Table 3's length 128, or the pretrained model's positions if fewer.
  c.classification.max_len = min(128, c.model.max_len)
  c.classification.buckets = tuple(
      b for b in (32, 64, 128) if b <= c.classification.max_len
  )
  steps = epochs * -(-n_train // batch)
  c.train.num_steps = steps
  c.train.log_every = min(50, steps)
  c.train.eval_every = max(1, steps // (2 * epochs))  # twice per epoch
  c.train.checkpoint_every = steps
  c.optim.learning_rate = lr
  c.optim.schedule = "linear"
  c.optim.warmup_steps = int(0.06 * steps)
  c.optim.weight_decay = 0.1
  c.optim.b2 = 0.98


def _memory(c, kind, num_keys, heads, topk, k_dim, frozen=False) -> None:
  m = base.use_kinds(c, feed_forward=kind).model  # Every option filled in.
  m.feed_forward_layers = memory_layers(m.num_layers)
  o = m.feed_forward_options
  o.num_keys, o.heads, o.topk, o.k_dim = num_keys, heads, topk, k_dim
  o.query_norm = "batch"  # Kim & Jung, section 5.1
  # How the values are read (docs/pkm.md): the memory-bounded bag, its
  # columns per step (0 = up to 8); 'gather' is the plain form.
  o.read, o.read_group = "bag", 0
  if frozen:
    c.optim.groups.memory_frozen = ml_collections.ConfigDict(
        {"params": FROZEN, "transform": "frozen"}
    )
    return
  c.optim.groups.memory_values = ml_collections.ConfigDict(
      {
          "params": VALUES,
          "transform": "lazy_adam",
          "learning_rate": 1e-3,
          "schedule": "constant",
          "warmup_steps": 0,
          "b2": 0.999,
          "weight_decay": 0.0,
      }
  )


def sentiment_dir() -> str:
  """The shipped sentiment set (for scripts and notebooks)."""
  return os.path.join(sources.DEMO_DATA_DIR, "sentiment")
