"""Modified MARGE (Komatsuzaki 2021): a causal LM that retrieves its sources.

* ``model``: the LM with biased cross-attention ('marge' model family);
* ``retrieval``: causal retrieval and its batches ('marge' batcher);
* ``reindex``: the step hook that re-embeds the corpus ('marge_reindex');
* ``evaluation``: ``--mode=marge_eval``, with retrieval on and off.
"""

REGISTERS = {
    "MODEL_FAMILIES": (f"{__name__}.model",),
    "BATCHERS": (f"{__name__}.retrieval",),
    "HOOKS": (f"{__name__}.reindex",),
}
MODES = {
    "marge_eval": {
        "run": f"{__name__}.evaluation:marge_eval",
        "help": "evaluate modified MARGE with retrieval on and off",
        "kinds": ("lm/marge",),
    }
}
