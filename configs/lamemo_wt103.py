"""LaMemo: look-ahead memory (Ji et al. 2022), its ablations, and TRIME_long.

Usage: ``--config=configs/lamemo_wt103.py:VARIANT`` with VARIANT = SIZE or
METHOD_SIZE. The sizes are those of ``configs/txl_wt103.py`` (``smoke``,
``demo``, ``base``, ``enwik8``, ``text8``), with the same training settings.

METHOD:

* ``lamemo`` (default): look-ahead attention, memory interpolation,
  disentangled relative positions (the paper's full model).
* ``no_interp``: alpha = 0, the memory is the look-ahead attention only
  (Table 3, "w/o mem interp").
* ``no_lookahead``: the memory is never refreshed (Table 3, "w/o
  look-ahead"; equal to Transformer-XL with disentangled positions).
* ``xl_pos``: Transformer-XL's relative positions for both directions
  (Table 3, "Full, Dai et al.", which the paper reports fails to train).
* ``trime_long``: TRIMELM_long's objective (the TRIME contrastive loss over
  the long-term memory of m consecutive segments per lane) on a LaMemo
  backbone, the combination the TRIME paper leaves to future work. Each
  step holds m = 4 consecutive segments of every lane; the train step runs
  them in order, carrying the LaMemo memory, and the loss sees each lane's
  whole stream.
"""

from __future__ import annotations

import importlib.util
import os

from memjax import config as base

# The sibling file, loaded by path: this file is itself loaded by path (from
# the checkout's configs/ or the copy installed as memjax/configs).
_spec = importlib.util.spec_from_file_location(
    "txl_wt103", os.path.join(os.path.dirname(__file__), "txl_wt103.py")
)
txl_wt103 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(txl_wt103)

SIZES = txl_wt103.SIZES
METHODS = ("lamemo", "no_interp", "no_lookahead", "xl_pos", "trime_long")

OPTIONS = {
    "lamemo": {},
    "no_interp": {"interpolate": False},
    "no_lookahead": {"look_ahead": False},
    "xl_pos": {"position": "xl"},
    "trime_long": {},
}
# Consecutive segments per lane and step for trime_long.
TRIME_LONG_SEGMENTS = 4


def get_config(arg: str = "demo"):
  method, size = base.parse_variant(arg, SIZES, METHODS)
  options = {
      "position": "disentangled",
      "look_ahead": True,
      "interpolate": True,
      "eps": 1e-6,
  }
  options.update(OPTIONS[method])
  c = txl_wt103.recurrent_config(size, "lamemo", options)
  c.name = f"{c.data.corpus}_{method}_{size}"
  if method == "trime_long":
    c.loss.name = "trime"
    c.trime.memory = "long"
    c.data.segments_per_lane = TRIME_LONG_SEGMENTS
    # Every micro-batch holds whole lanes (char_gpu's 22 rows become 24).
    rows = TRIME_LONG_SEGMENTS * c.train.grad_accum
    c.data.batch_size = -(-c.data.batch_size // rows) * rows
  return c
