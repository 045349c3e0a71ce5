"""The continuous cache (Grave et al. 2017), as an evaluation memory.

``memory``: the cache over M_local u M_long ('cache'), interpolated with
the model's distribution.
"""

REGISTERS = {"EVAL_MEMORIES": (f"{__name__}.memory",)}
CONFIG = f"{__name__}.config:add_defaults"
