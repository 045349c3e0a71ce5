"""The engine's modes of ``python -m memjax.main``, registered by name.

Each mode is registered in ``memjax.registry.MODES`` as a ``registry.Mode``:
``"module:function"``, a line of help and the run kinds it takes
(``registry.RUN_KINDS``; none listed: every run). ``memjax.main`` imports
the module when the mode runs (TensorFlow and the mode's dependencies load
only then) and calls ``function(config, workdir)``, which returns a results
dict; a run of a kind the mode does not take is refused in one line first.
These are the verbs any run takes; a method adds its own in its package
(``MODES`` in ``memjax/methods/<m>/__init__.py``). ``--mode=list`` prints
them all.
"""

from memjax import registry

_LM = ("lm/decoder_lm",)  # Sliding windows over a corpus: decoder LMs.
_BUILTIN = {
    "train": registry.Mode(
        "memjax.run.loop:train_and_evaluate",
        "train (resumes from the workdir's latest checkpoint)",
    ),
    "eval": registry.Mode(
        "memjax.modes.evaluation:evaluate_run",
        "evaluate the latest checkpoint on the config's splits",
    ),
    "export": registry.Mode(
        "memjax.api:export_run",
        "write a params-only export (--export_dir, --export_dtype)",
    ),
    # Token caches and vocabulary only (then train where SeqIO is absent).
    "tokenize": registry.Mode(
        "memjax.modes.tokenize:tokenize",
        "write the token caches and vocabulary, train nothing",
        (),
    ),
    "generate": registry.Mode(
        "memjax.modes.generate:generate",
        "top-p sampling after a prompt from a split, memory carried",
        _LM,
    ),
    # Evaluation with testing memories (memjax/modes/memory.py).
    "memeval": registry.Mode(
        "memjax.modes.memory:memeval",
        "evaluate with the configured testing memory (eval_memory.*)",
        _LM,
    ),
    "tune": registry.Mode(
        "memjax.modes.memory:tune",
        "grid-search the testing memory on valid, then test (tune.json)",
        _LM,
    ),
    "memsweep": registry.Mode(
        "memjax.modes.memory:memsweep",
        "valid perplexity against the long-term memory size",
        _LM,
    ),
    "buckets": registry.Mode(
        "memjax.modes.memory:buckets",
        "perplexity by token-frequency bucket, with and without memory",
        _LM,
    ),
    # Translation (encoder-decoder); see docs/translation.md.
    "translate": registry.Mode(
        "memjax.modes.translation:translate",
        "beam-translate a file or a split, scored by sacreBLEU",
        ("translation",),
    ),
    # Early-token analysis (any LM): loss by position in a document.
    "position_loss": registry.Mode(
        "memjax.modes.position_loss:position_loss",
        "mean loss by position within a document",
        ("lm",),
    ),
    # Compile the train step for a target without running it (docs/plan.md).
    "plan": registry.Mode(
        "memjax.modes.plan:plan",
        "compile the train step for --config.plan.* (devices, platform), run nothing",
        (),
        ("plan.json", "plan.md"),
    ),
}
for _name, _mode in _BUILTIN.items():
  registry.MODES.register(_name, _mode)
