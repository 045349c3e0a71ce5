"""The PKM-in-BERT demo's rows and run directories (no flags, no training).

``memjax/demos/pkm_bert.py`` trains and scores them; this module can be
imported beside another demo's (each demo module defines its own flags).
"""

from __future__ import annotations

from memjax.demos import common
from memjax.io import paths

# The fine-tuning seeds when --seeds is not given.
DEFAULT_SEEDS = ("0",)


def _row(key: str, label: str, mlm: str, base: str, finetune: str):
  return common.Row(
      key, label, "pkm_bert", mlm, base=base, options={"finetune": finetune}
  )


# MLM method (the variant's METHOD), the row it starts from, fine-tuning
# method.
ROWS = {
    r.key: r
    for r in (
        _row("a", "(a) BERT, no memory", "vanilla", "", "cls"),
        _row("b", "(b) (a) + extra steps", "vanilla", "a", "cls"),
        _row("c", "(c) +PKM", "pkm", "", "cls_pkm"),
        _row("d", "(d) +ResM", "resm", "", "cls_resm"),
        _row("e", "(e) +Init +PKM", "init_pkm", "a", "cls_pkm"),
        _row("f", "(f) +Init +ResM", "init_resm", "a", "cls_resm"),
        _row(
            "f_fresh",
            "(f') +Init +ResM, fresh FFN",
            "init_resm_fresh_ffn",
            "a",
            "cls_resm",
        ),
    )
}


def mlm_dir(root: str, key: str) -> str:
  """The masked-LM run of row ``key``."""
  return paths.join(root, key, "mlm")


def finetune_dir(root: str, key: str, seed: int, frozen: bool) -> str:
  """The fine-tuned classifier of row ``key`` with ``seed``."""
  return paths.join(root, key, f"cls{'_frozen' if frozen else ''}_seed{seed}")
