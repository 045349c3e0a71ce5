"""Modified MARGE (Komatsuzaki 2021): a causal LM that retrieves its sources.

* ``model``: the LM with biased cross-attention ('marge' model family);
* ``retrieval``: causal retrieval and its batches ('marge' batcher);
* ``reindex``: the step hook that re-embeds the corpus ('marge_reindex');
* ``evaluation``: ``--mode=marge_eval``, with retrieval on and off;
* ``flops``: what it computes beyond ``--mode=plan``'s formula.
"""

from memjax import extend
from memjax.methods.marge import config
from memjax.methods.marge import evaluation
from memjax.methods.marge import flops
from memjax.methods.marge import model
from memjax.methods.marge import reindex
from memjax.methods.marge import retrieval

METHOD = extend.Method(
    name="marge",
    families={"marge": model.FAMILY},
    batchers={
        "marge": extend.Batcher(retrieval.marge_batcher, retrieval.marge_shapes)
    },
    hooks={"marge_reindex": reindex.MargeReindex},
    flops=(flops.marge_flops,),
    modes={
        "marge_eval": extend.Mode(
            evaluation.marge_eval,
            "evaluate modified MARGE with retrieval on and off",
            ("lm/marge",),
            outputs=("marge_eval.json",),
        )
    },
    settings=config.SETTINGS,
    renames=config.RENAMES,
)
