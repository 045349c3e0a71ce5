"""Modes of ``python -m memjax.main``, registered by name.

Each mode is registered in ``memjax.registry.MODES`` as ``"module:function"``;
``memjax.main`` imports the module when the mode runs (TensorFlow and the
mode's dependencies load only then) and calls ``function(config, workdir)``,
which returns a results dict. The memory-evaluation modes are in
``memjax/modes/memory.py``.
"""

from memjax import registry

_BUILTIN = {
    "train": "memjax.train:train_and_evaluate",
    "eval": "memjax.modes.evaluation:evaluate_run",
    "export": "memjax.api:export_run",
    # Recurrent-memory models (Transformer-XL, LaMemo); see docs/lamemo.md.
    "extrapolate": "memjax.recurrent_eval:extrapolate",
    "analyze": "memjax.analysis.recurrence:analyze",
    "generate": "memjax.generate:generate",
    # TRIME: evaluation with testing memories and the offline BM25 packing.
    "memeval": "memjax.modes.memory:memeval",
    "tune": "memjax.modes.memory:tune",
    "memsweep": "memjax.modes.memory:memsweep",
    "buckets": "memjax.modes.memory:buckets",
    "pack": "memjax.data.packing:pack",
    # Translation (encoder-decoder); see docs/translation.md.
    "translate": "memjax.modes.translation:translate",
    # Translation with an external memory (kNN-MT, TRIMEMT_ext); see
    # docs/trime_mt.md.
    "mt_datastore": "memjax.modes.translation_memory:mt_datastore_mode",
    "mt_tune": "memjax.modes.translation_memory:mt_tune",
    "mt_translate": "memjax.modes.translation_memory:mt_translate",
    # Product-key memory: usage per memory layer; see docs/pkm.md.
    "memory_usage": "memjax.pkm_usage:memory_usage",
    # External memory: datastore, ScaNN index, recall against exact search.
    "datastore": "memjax.modes.external:datastore",
    "index": "memjax.modes.external:index",
    "recall": "memjax.modes.external:recall",
    # Early-token analysis (any run): loss by position in a document.
    "position_loss": "memjax.modes.position_loss:position_loss",
    # Modified MARGE: perplexity with retrieval on and off; docs/marge.md.
    "marge_eval": "memjax.modes.marge_eval:marge_eval",
}
for _name, _target in _BUILTIN.items():
  registry.MODES.register(_name, _target)
