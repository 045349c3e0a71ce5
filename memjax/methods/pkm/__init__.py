"""Product-key memory (Lample et al. 2019) and residual memory (Kim & Jung 2020).

* ``layer``: the memory and its feed-forward kinds ('pkm', 'resm', and
  Memory+'s 'memory_plus');
* ``bag``, ``sharded``: its read, memory-bounded, and where the table's
  rows are split over devices;
* ``counts``: per-slot sums of its reads and the usage metrics;
* ``lazy_adam``: the optimiser transform of the memory values
  ('lazy_adam');
* ``usage``: memory usage (MU, top-1 MU, KL), ``--mode=memory_usage`` and
  the report evaluation adds up ('memory');
* ``class_usage``: top-1 usage by class (Kim & Jung's Figure 4);
* ``flops``: the values it reads, for ``--mode=plan``'s formula;
* ``config``: its settings.
"""

from memjax import extend
from memjax.methods.pkm import config
from memjax.methods.pkm import flops
from memjax.methods.pkm import layer
from memjax.methods.pkm import lazy_adam
from memjax.methods.pkm import usage

METHOD = extend.Method(
    name="pkm",
    feed_forward={
        "pkm": layer.PKM,
        "resm": layer.RESM,
        "memory_plus": layer.MEMORY_PLUS,
    },
    optimizer_transforms={"lazy_adam": lazy_adam.lazy_adam_of},
    sum_reports={"memory": usage.REPORT},
    modes={
        "memory_usage": extend.Mode(
            usage.memory_usage,
            "memory-layer usage (MU, top-1 MU, KL) on the splits",
            ("lm/decoder_lm",),
            outputs=("memory_usage.json", "memory_usage.png"),
        )
    },
    flops=(flops.memory_flops,),
    settings=(config.MemoryUsage,),
)
