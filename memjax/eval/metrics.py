"""What a scored stream reports: perplexity or bits per character, the
modules' statistics, the progress line and the unigram floor."""

from __future__ import annotations

import math
import time
from typing import Any, Mapping

import numpy as np

from memjax.io import console
from memjax.models import variables as model_vars


def summarize(nll_sum: float, tokens: float, unit: str) -> dict[str, float]:
  """Turns summed NLL (nats) into per-token NLL and ppl or bpc."""
  nll = nll_sum / max(tokens, 1.0)
  out = {"nll": nll, "tokens": float(tokens)}
  if unit == "bpc":
    out["bpc"] = nll / math.log(2.0)
  else:
    out["ppl"] = math.exp(min(nll, 700.0))
  return out


def with_stats(
    result: dict[str, float], sums: Mapping[str, Any]
) -> dict[str, float]:
  """``result`` plus 'aux/<path>': the mean of each statistic the modules
  reported (``sums``: {path: [..., 2]} from ``memjax.models.variables``)."""
  result.update({f"aux/{k}": v for k, v in model_vars.means(sums).items()})
  return result


def log(desc: str, result: Mapping[str, float], start: float, how: str = ""):
  """The console line of a scored stream."""
  console.info(
      "%s%s: %d predictions in %.1fs: %s",
      desc,
      f" ({how})" if how else "",
      int(result["tokens"]),
      time.time() - start,
      ", ".join(f"{k}={v:.4f}" for k, v in result.items()),
  )


def unigram_baseline(
    train_tokens: np.ndarray,
    eval_tokens: np.ndarray,
    vocab_size: int,
    unit: str,
) -> dict[str, float]:
  """Add-one smoothed unigram model of the training split, scored on a split."""
  counts = (
      np.bincount(train_tokens, minlength=vocab_size).astype(np.float64) + 1
  )
  logp = np.log(counts / counts.sum())
  nll = -logp[eval_tokens[1:]].sum()
  return summarize(float(nll), float(len(eval_tokens) - 1), unit)
