"""TRIME (Zhong et al. 2022): training with in-batch memories.

* ``objective``: the TRIME loss (Eq. 5) with the local, long and external
  training memories ('trime');
* ``memory``: its maths, and the evaluation memory of Eq. 6 ('trime');
* ``bm25``, ``bm25_order``, ``packing``: BM25 batches (Algorithm 1), the
  offline packing (``--mode=pack``) and the 'bm25' batcher;
* ``mt``: TRIMEMT_ext's objective and BM25 token batches for translation.
"""

REGISTERS = {
    "OBJECTIVES": (f"{__name__}.objective", f"{__name__}.mt"),
    "CONFIG_CHECKS": (f"{__name__}.objective",),
    "EVAL_MEMORIES": (f"{__name__}.memory",),
    "BATCHERS": (f"{__name__}.packing", f"{__name__}.mt"),
}
MODES = {
    "pack": {
        "run": f"{__name__}.packing:pack",
        "help": "pack the training corpus into BM25 batches (Algorithm 1)",
        "kinds": ("lm",),
        "writes": ("bm25_pack.json",),
    }
}
CONFIG = f"{__name__}.config:add_defaults"
