"""The continuous cache (Grave et al. 2017), as an evaluation memory.

``memory``: the cache over M_local u M_long ('cache'), interpolated with
the model's distribution; ``config``: its settings.
"""

from memjax import extend
from memjax.methods.cache import config
from memjax.methods.cache import continuous_cache

METHOD = extend.Method(
    name="cache",
    eval_memories={"cache": continuous_cache.CacheMemory()},
    settings=(config.CacheEvalMemory,),
    renames=config.RENAMES,
)
