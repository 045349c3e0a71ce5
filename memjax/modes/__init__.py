"""The engine's modes of ``python -m memjax.main``, registered by name.

Each mode is registered in ``memjax.registry.MODES`` as ``"module:function"``;
``memjax.main`` imports the module when the mode runs (TensorFlow and the
mode's dependencies load only then) and calls ``function(config, workdir)``,
which returns a results dict. These are the verbs any run takes; a method
adds its own in its package (``MODES`` in ``memjax/methods/<m>/__init__.py``).
"""

from memjax import registry

_BUILTIN = {
    "train": "memjax.train:train_and_evaluate",
    "eval": "memjax.modes.evaluation:evaluate_run",
    "export": "memjax.api:export_run",
    "generate": "memjax.modes.generate:generate",
    # Evaluation with testing memories (memjax/modes/memory.py).
    "memeval": "memjax.modes.memory:memeval",
    "tune": "memjax.modes.memory:tune",
    "memsweep": "memjax.modes.memory:memsweep",
    "buckets": "memjax.modes.memory:buckets",
    # Translation (encoder-decoder); see docs/translation.md.
    "translate": "memjax.modes.translation:translate",
    # Early-token analysis (any run): loss by position in a document.
    "position_loss": "memjax.modes.position_loss:position_loss",
    # Compile the train step for a target without running it (docs/plan.md).
    "plan": "memjax.modes.plan:plan",
}
for _name, _target in _BUILTIN.items():
  registry.MODES.register(_name, _target)
