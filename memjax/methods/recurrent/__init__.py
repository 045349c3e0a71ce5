"""Segment recurrence: Transformer-XL (Dai et al. 2019) and LaMemo (Ji et al. 2022).

* ``relative``: relative-position attention ('rpe') and Transformer-XL
  ('xl');
* ``lamemo``: look-ahead memory ('lamemo');
* ``memory``: their memory pytrees;
* ``flops``: what they compute beyond ``--mode=plan``'s formula;
* ``extrapolate``, ``analysis``: ``--mode=extrapolate`` and
  ``--mode=analyze``;
* ``config``: their settings.
"""

from memjax import extend
from memjax.methods.recurrent import analysis
from memjax.methods.recurrent import config
from memjax.methods.recurrent import extrapolate
from memjax.methods.recurrent import flops
from memjax.methods.recurrent import lamemo
from memjax.methods.recurrent import relative

_LM = ("lm/decoder_lm",)

METHOD = extend.Method(
    name="recurrent",
    attention={
        "xl": relative.XLAttention,
        "rpe": relative.DisentangledAttention,
        "lamemo": lamemo.LaMemoAttention,
    },
    modes={
        "extrapolate": extend.Mode(
            extrapolate.extrapolate,
            "evaluate with memories of m times the segment length",
            _LM,
            outputs=(
                "extrapolation.json",
                "extrapolation.csv",
                "extrapolation.png",
            ),
        ),
        "analyze": extend.Mode(
            analysis.analyze,
            "attention analyses (alpha per layer, attention by distance)",
            _LM,
            outputs=(
                "analysis.json",
                "alpha.npy",
                "alpha.png",
                "attention_by_distance.npy",
                "attention_by_distance.png",
            ),
        ),
    },
    flops=(flops.relative_flops,),
    settings=(config.Extrapolate, config.Analyze),
)
