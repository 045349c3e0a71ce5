"""TRIME (Zhong et al. 2022): training with in-batch memories.

* ``objective``: the TRIME loss (Eq. 5) with the local, long and external
  training memories ('trime');
* ``in_batch``: its maths, and the evaluation memory of Eq. 6 ('trime');
* ``bm25``, ``bm25_order``, ``packing``: BM25 batches (Algorithm 1), the
  offline packing (``--mode=pack``) and the 'blocks' and 'bm25' batchers;
* ``mt``: TRIMEMT_ext's objective and BM25 token batches for translation;
* ``config``: its settings.
"""

from memjax import extend
from memjax.data import batchers
from memjax.methods.trime import config
from memjax.methods.trime import in_batch
from memjax.methods.trime import mt
from memjax.methods.trime import objective
from memjax.methods.trime import packing
from memjax.tasks.translation import task as translation

METHOD = extend.Method(
    name="trime",
    objectives={
        "trime": objective.make_trime_loss,
        "trime_mt": mt.make_trime_mt_loss,
    },
    checks=(objective.check_trime_settings,),
    eval_memories={"trime": in_batch.TrimeMemory()},
    batchers={
        "blocks": extend.Batcher(packing.blocks_batcher, packing.block_shapes),
        "bm25": extend.Batcher(packing.bm25_batcher, batchers.segment_shapes),
        "tokens_bm25": extend.Batcher(
            mt.make_bm25_token_batcher, translation.token_shapes
        ),
    },
    modes={
        "pack": extend.Mode(
            packing.pack,
            "pack the training corpus into BM25 batches (Algorithm 1)",
            kinds=("lm",),
            writes=("bm25_pack.json",),
            outputs=("bm25_pack.json", "cache/bm25/bm25_order_*.npy"),
        )
    },
    settings=config.SETTINGS,
    defaults=config.DEFAULTS,
    renames=config.RENAMES,
)
