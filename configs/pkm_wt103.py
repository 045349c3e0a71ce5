"""WikiText-103 LMs with product-key memory (Lample et al. 2019) and residual
memory (Kim & Jung 2020), plain or TRIME-trained.

Usage: ``--config=configs/pkm_wt103.py:VARIANT`` with VARIANT = SIZE or
METHOD_SIZE. SIZE is one of ``configs/trime_wt103.py``'s (``smoke``,
``demo``, ``247m``, ``150m``, ``7m``), with its model, data and training
settings. METHOD:

* ``vanilla`` (default): the memory-less model of that size, trained with
  the same steps (the baseline of the rows below).
* ``pkm``: memory layers replace the FFN of the chosen layers (Lample et
  al.'s LM setting; x' = LN(x + PKM(x))).
* ``resm``: residual memory, FFN + PKM (Kim & Jung, section 4.2).
* ``memory_plus``: Memory+ (Berges et al. 2025) replaces the FFN: the
  memory's output gated, ``(PKM(x) ⊙ silu(x W1)) W2``, with qk-norm, and
  one values table shared by the memory layers.
* ``trime_pkm``, ``trime_resm``: the same, trained with TRIMELM's objective
  (the TRIME loss with the local memory), a combination neither paper has.

Memory layers sit at regular intervals as Kim & Jung place them ({2, 4} of
6 layers, {4, 8} of 12): layers L/3 and 2L/3 rounded up (for 4 layers:
{2, 3}; 16 layers: {6, 11}). Memory settings per size: the paper's 512^2
slots, 4 heads, k = 32, k_dim 256 at the full sizes; 128^2 slots at demo
size, which the demo corpus's held-out data (about 25k tokens x 4 heads x
32 reads) can cover, so usage numbers mean something; 16^2 at smoke size.
The values are trained by lazy Adam at 1e-3, constant (Lample et al.), in
their own parameter group; the rest keeps the size's optimiser.
"""

import importlib.util
import os

import ml_collections

from memjax import config as base

# The sibling file, loaded by path: this file is itself loaded by path (from
# the checkout's configs/ or the copy installed as memjax/configs).
_spec = importlib.util.spec_from_file_location(
    "trime_wt103", os.path.join(os.path.dirname(__file__), "trime_wt103.py")
)
trime_wt103 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trime_wt103)

SIZES = trime_wt103.SIZES
METHODS = ("vanilla", "pkm", "resm", "memory_plus", "trime_pkm", "trime_resm")

# Per size: (num_keys C, heads, topk k, k_dim).
MEMORY = {
    "smoke": (16, 2, 4, 16),
    "demo": (128, 4, 32, 64),
    "247m": (512, 4, 32, 256),
    "150m": (512, 4, 32, 256),
    "7m": (512, 4, 32, 256),
}


def memory_layers(num_layers: int) -> tuple[int, ...]:
  """Two memory layers at regular intervals, 1-based: {4, 8} of 12."""
  a, b = -(-num_layers // 3), -(-2 * num_layers // 3)
  return tuple(sorted({max(a, 1), max(b, 1)}))


def get_config(arg: str = "demo"):
  method, size = base.parse_variant(arg, SIZES, METHODS)
  trime = method.startswith("trime_")
  c = trime_wt103.get_config(f"trime_{size}" if trime else size)
  c.name = f"wt103_{method}_{size}"
  if method != "vanilla":
    apply_memory(c, method.replace("trime_", ""), *MEMORY[size])
  return c


def apply_memory(
    c: ml_collections.ConfigDict,
    kind: str,
    num_keys: int,
    heads: int,
    topk: int,
    k_dim: int,
) -> None:
  """Puts memory layers of ``kind`` ('pkm', 'resm' or 'memory_plus') into
  config ``c``."""
  m = base.use_kinds(c, feed_forward=kind).model  # Every option filled in.
  m.feed_forward_layers = memory_layers(m.num_layers)
  m.feed_forward_options.num_keys = num_keys
  m.feed_forward_options.heads = heads
  m.feed_forward_options.topk = topk
  m.feed_forward_options.k_dim = k_dim
  m.feed_forward_options.query_norm = "layer"  # Causal: no batch statistics.
  # How the values are read (docs/pkm.md): the memory-bounded bag, its
  # columns per step (0 = up to 8); 'gather' is the plain form.
  m.feed_forward_options.read = "bag"
  m.feed_forward_options.read_group = 0
  if kind == "memory_plus":  # Berges et al.'s shared pool.
    m.feed_forward_options.shared_values = True
  # BatchNorm queries (query_norm='batch') see later positions through the
  # batch statistics: refused unless this is set (docs/pkm.md).
  m.feed_forward_options.allow_batchnorm_future_leak = False
  c.optim.groups.memory_values = ml_collections.ConfigDict(
      {
          # Per layer, or the one table of shared_values.
          "params": "/ffn/memory/values$|^ffn_shared/values$",
          "transform": "lazy_adam",
          "learning_rate": 1e-3,
          "schedule": "constant",
          "warmup_steps": 0,
          "b2": 0.999,
          "weight_decay": 0.0,
      }
  )
