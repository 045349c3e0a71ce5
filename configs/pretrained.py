"""Pretrained causal LMs imported from a local Hugging Face folder.

Usage: ``--config=configs/pretrained.py:import --config.pretrained.path=DIR
--workdir=W --mode=import`` (docs/pretrained.md). The model's sizes and
options come from DIR's config.json at import, so a variant names what is
done with the model, not its sizes:

* ``import``: the plain model (no memory), scored with windows of 512
  tokens of which the last 256 are scored (cut to the model's positions
  when it has fewer), on WikiText-103's raw text (``wikitext103_raw``;
  ``--config.data.corpus=text`` reads any ``{train,valid,test}.txt``)
  through the imported tokenizer.
"""

from memjax import config as base
from memjax import errors

VARIANTS = ("import",)


def get_config(arg: str = "import"):
  if arg not in VARIANTS:
    raise errors.ConfigError(
        f"unknown config variant {arg!r} of configs/pretrained.py; pick one of "
        f"{', '.join(VARIANTS)}"
    )
  c = base.base_config()
  c.name = "pretrained"
  c.model.cutoffs = ()
  c.model.scale_embedding = False
  c.model.dropout = 0.0
  c.eval.window_len = 512
  c.eval.score_len = 256
  c.eval.batch_size = 4
  # Raw text through the imported tokenizer (memjax.data.text_streams):
  # the shipped demo copy unless data.data_dir names the release's.
  c.data.corpus = "wikitext103_raw"
  return c
