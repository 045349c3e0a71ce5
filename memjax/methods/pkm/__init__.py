"""Product-key memory (Lample et al. 2019) and residual memory (Kim & Jung 2020).

* ``layer``: the memory and its two feed-forward kinds ('pkm', 'resm');
* ``lazy_adam``: the optimiser transform of the memory values
  ('lazy_adam');
* ``usage``: memory usage (MU, top-1 MU, KL), ``--mode=memory_usage`` and
  the report evaluation adds up ('memory');
* ``class_usage``: top-1 usage by class (Kim & Jung's Figure 4).
"""

REGISTERS = {
    "FEED_FORWARD": (f"{__name__}.layer",),
    "OPTIMIZER_TRANSFORMS": (f"{__name__}.lazy_adam",),
    "SUM_REPORTS": (f"{__name__}.usage",),
}
MODES = {
    "memory_usage": {
        "run": f"{__name__}.usage:memory_usage",
        "help": "memory-layer usage (MU, top-1 MU, KL) on the splits",
        "kinds": ("lm/decoder_lm",),
    }
}
CONFIG = f"{__name__}.config:add_defaults"
