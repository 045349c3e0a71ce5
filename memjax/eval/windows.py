"""Perplexity and bits-per-character evaluation.

The protocol is Baevski & Auli's (TRIME paper, App. D): fixed-length windows
slide over the split's token stream; only the last ``score_len`` predictions of
a window are scored, the rest is context, and every prediction is scored
exactly once (``memjax.data.streams.eval_windows``).
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from memjax import console
from memjax import sharding as sharding_lib
from memjax import stats
from memjax.data import streams

Array = jax.Array


def make_eval_step(model) -> Callable:
  """Jitted (params, batch) -> {'nll_sum', 'tokens'} over the weighted
  targets, and 'stats': {path: [2]} sums of the statistics the modules
  report (``memjax.stats``)."""

  def step(params, batch):
    out, sums = stats.apply(
        model,
        {"params": params},
        batch["inputs"],
        batch["targets"],
        deterministic=True,
    )
    w = batch["weights"]
    return {
        "nll_sum": -jnp.sum(out.target_logprob * w),
        "tokens": jnp.sum(w),
        "stats": sums,
    }

  return jax.jit(step)


def summarize(nll_sum: float, tokens: float, unit: str) -> dict[str, float]:
  """Turns summed NLL (nats) into per-token NLL and ppl or bpc."""
  nll = nll_sum / max(tokens, 1.0)
  out = {"nll": nll, "tokens": float(tokens)}
  if unit == "bpc":
    out["bpc"] = nll / math.log(2.0)
  else:
    out["ppl"] = math.exp(min(nll, 700.0))
  return out


def metric_unit(corpus: str) -> str:
  return "bpc" if corpus in ("enwik8", "text8") else "ppl"


def evaluate_tokens(
    eval_step: Callable,
    params: Any,
    tokens: np.ndarray,
    *,
    window_len: int,
    score_len: int,
    batch_size: int,
    mesh: Mesh,
    unit: str,
    max_windows: int = 0,
    desc: str = "eval",
) -> dict[str, float]:
  """Scores a token stream with sliding windows.

  Args:
    eval_step: from ``make_eval_step``.
    params: model parameters.
    tokens: [N] int32 token stream of the split.
    window_len: tokens per window (context + scored).
    score_len: scored predictions at the end of each window.
    batch_size: windows per batch (padded to the data-parallel size).
    mesh: device mesh.
    unit: 'ppl' or 'bpc'.
    max_windows: score only the first this many windows (0 = all).
    desc: name for the progress log.

  Returns:
    {'nll', 'tokens', 'ppl' | 'bpc'} and 'aux/<path>': the mean of each
    statistic the modules report (``memjax.stats``).
  """
  dp = mesh.shape["data"] * mesh.shape["fsdp"]
  batch_size = int(math.ceil(batch_size / dp) * dp)
  if max_windows:
    windows = streams.eval_windows(len(tokens) - 1, window_len, score_len)
    last = windows[min(max_windows, len(windows)) - 1]
    tokens = tokens[: int(last[0]) + int(last[1]) + 1]
  nll_sum, count = 0.0, 0.0
  start = time.time()
  pending = []
  for batch in streams.eval_batches(tokens, window_len, score_len, batch_size):
    pending.append(
        eval_step(params, sharding_lib.put_global_batch(batch, mesh))
    )
  fetched = jax.device_get(pending)
  for m in fetched:
    nll_sum += float(m["nll_sum"])
    count += float(m["tokens"])
  res = summarize(nll_sum, count, unit)
  names = fetched[0].get("stats", {}) if fetched else {}
  aux = {k: np.stack([m["stats"][k] for m in fetched]) for k in names}
  res.update({f"aux/{k}": v for k, v in stats.means(aux).items()})
  console.info(
      "%s: %d predictions in %.1fs: %s",
      desc,
      int(count),
      time.time() - start,
      ", ".join(f"{k}={v:.4f}" for k, v in res.items()),
  )
  return res


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
