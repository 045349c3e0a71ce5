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
    "extrapolate": f"{__name__}.extrapolate:extrapolate",
    "analyze": f"{__name__}.analysis:analyze",
}
CONFIG = f"{__name__}.config:add_defaults"
