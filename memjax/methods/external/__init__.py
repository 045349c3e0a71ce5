"""Retrieval from a corpus-wide datastore: kNN-LM, TRIMELM_ext, kNN-MT, TRIMEMT_ext.

* ``memories``: the evaluation memories 'knn', 'knn_cache' and 'trime_ext';
* ``modes``: ``--mode=datastore``, ``index`` and ``recall``;
* ``mt_datastore``, ``memory_decoding``, ``mt_modes``: the same for
  translation (``--mode=mt_datastore``, ``mt_tune``, ``mt_translate``);
* ``config``: its settings.

It builds on TRIME (``trime_ext``) and the cache (``knn_cache``).
"""

from memjax import extend
from memjax.methods.external import config
from memjax.methods.external import memories
from memjax.methods.external import modes
from memjax.methods.external import mt_modes

_LM = ("lm/decoder_lm",)

METHOD = extend.Method(
    name="external",
    builds_on=("trime", "cache"),
    eval_memories={
        "knn": memories.KnnMemory(),
        "knn_cache": memories.KnnCacheMemory(),
        "trime_ext": memories.TrimeExtMemory(),
    },
    modes={
        "datastore": extend.Mode(
            modes.datastore,
            "build the kNN datastore of a corpus's keys and next tokens",
            _LM,
            outputs=(
                "datastore/manifest.json",
                "datastore/shard-*.keys",
                "datastore/shard-*.values",
            ),
        ),
        "index": extend.Mode(
            modes.index,
            "build the ScaNN index of the datastore",
            _LM,
            outputs=("datastore/index-*/index.json",),
        ),
        "recall": extend.Mode(
            modes.recall,
            "recall and speed of the index against exact search",
            _LM,
            outputs=("recall.json",),
        ),
        "mt_datastore": extend.Mode(
            mt_modes.mt_datastore_mode,
            "datastore and index of the training targets' decoder states",
            ("translation",),
            outputs=(
                "mt_datastore/manifest.json",
                "mt_datastore/index-*/index.json",
            ),
        ),
        "mt_tune": extend.Mode(
            mt_modes.mt_tune,
            "tune kNN-MT's K, lambda, temperature by teacher-forced NLL",
            ("translation",),
            outputs=("mt_tune_*.json",),
        ),
        "mt_translate": extend.Mode(
            mt_modes.mt_translate,
            "beam search with the external memory, sacreBLEU",
            ("translation",),
            outputs=("mt_translate_*.json", "translations/*.txt"),
        ),
    },
    settings=config.SETTINGS,
    renames=config.RENAMES,
)
