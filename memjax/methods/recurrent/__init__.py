"""Segment recurrence: Transformer-XL (Dai et al. 2019) and LaMemo (Ji et al. 2022).

* ``relative``: relative-position attention ('rpe') and Transformer-XL
  ('xl');
* ``lamemo``: look-ahead memory ('lamemo');
* ``memory``: their memory pytrees;
* ``extrapolate``, ``analysis``: ``--mode=extrapolate`` and
  ``--mode=analyze``.
"""

REGISTERS = {"ATTENTION": (f"{__name__}.relative", f"{__name__}.lamemo")}
MODES = {
    "extrapolate": {
        "run": f"{__name__}.extrapolate:extrapolate",
        "help": "evaluate with memories of m times the segment length",
        "kinds": ("lm/decoder_lm",),
    },
    "analyze": {
        "run": f"{__name__}.analysis:analyze",
        "help": "attention analyses (alpha per layer, attention by distance)",
        "kinds": ("lm/decoder_lm",),
    },
}
CONFIG = f"{__name__}.config:add_defaults"
