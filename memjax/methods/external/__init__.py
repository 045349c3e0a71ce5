"""Retrieval from a corpus-wide datastore: kNN-LM, TRIMELM_ext, kNN-MT, TRIMEMT_ext.

* ``memories``: the evaluation memories 'knn', 'knn_cache' and 'trime_ext';
* ``modes``: ``--mode=datastore``, ``index`` and ``recall``;
* ``mt_datastore``, ``memory_decoding``, ``mt_modes``: the same for
  translation (``--mode=mt_datastore``, ``mt_tune``, ``mt_translate``).

It builds on TRIME (``trime_ext``) and the cache (``knn_cache``).
"""

REGISTERS = {"EVAL_MEMORIES": (f"{__name__}.memories",)}
MODES = {
    "datastore": {
        "run": f"{__name__}.modes:datastore",
        "help": "build the kNN datastore of a corpus's keys and next tokens",
        "kinds": ("lm/decoder_lm",),
    },
    "index": {
        "run": f"{__name__}.modes:index",
        "help": "build the ScaNN index of the datastore",
        "kinds": ("lm/decoder_lm",),
    },
    "recall": {
        "run": f"{__name__}.modes:recall",
        "help": "recall and speed of the index against exact search",
        "kinds": ("lm/decoder_lm",),
    },
    "mt_datastore": {
        "run": f"{__name__}.mt_modes:mt_datastore_mode",
        "help": "datastore and index of the training targets' decoder states",
        "kinds": ("translation",),
    },
    "mt_tune": {
        "run": f"{__name__}.mt_modes:mt_tune",
        "help": "tune kNN-MT's K, lambda, temperature by teacher-forced NLL",
        "kinds": ("translation",),
    },
    "mt_translate": {
        "run": f"{__name__}.mt_modes:mt_translate",
        "help": "beam search with the external memory, sacreBLEU",
        "kinds": ("translation",),
    },
}
CONFIG = f"{__name__}.config:add_defaults"
