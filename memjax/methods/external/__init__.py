"""Retrieval from a corpus-wide datastore: kNN-LM, TRIMELM_ext, kNN-MT, TRIMEMT_ext.

* ``memories``: the evaluation memories 'knn', 'knn_cache' and 'trime_ext';
* ``modes``: ``--mode=datastore``, ``index`` and ``recall``;
* ``mt_datastore``, ``memory_decoding``, ``mt_modes``: the same for
  translation (``--mode=mt_datastore``, ``mt_tune``, ``mt_translate``).

It builds on TRIME (``trime_ext``) and the cache (``knn_cache``).
"""

REGISTERS = {"EVAL_MEMORIES": (f"{__name__}.memories",)}
MODES = {
    "datastore": f"{__name__}.modes:datastore",
    "index": f"{__name__}.modes:index",
    "recall": f"{__name__}.modes:recall",
    "mt_datastore": f"{__name__}.mt_modes:mt_datastore_mode",
    "mt_tune": f"{__name__}.mt_modes:mt_tune",
    "mt_translate": f"{__name__}.mt_modes:mt_translate",
}
CONFIG = f"{__name__}.config:add_defaults"
