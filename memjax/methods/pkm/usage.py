"""``--mode=memory_usage``: how much of each product-key memory is used.

Runs a trained model over held-out data (``memory_usage.split``) in
non-overlapping windows of ``eval.window_len`` tokens, so each token is
read once, and adds up every memory layer's per-slot sums (the
``'pkm_usage'`` collection of ``memjax.methods.pkm.layer``: read counts u', top-1
counts t', summed weights w'). ``memory_usage.count`` says how u' and t'
count: 'token' (default), Kim & Jung's t'_i = sum_x delta(argmax_j w(x)_j
= i), one top-1 per token (the argmax of its weights summed over heads per
slot) and one read per token and slot; 'head', every head's read and top-1
(H top-1 events per token). From them, per layer (Kim & Jung 2020,
section 3.2):

* MU: share of slots read at least once; top-1 MU: share of slots that were
  a top-1 at least once;
* KL_u, KL_w: KL divergence from uniform of the normalised counts and
  weights, ``log |K| + sum_i p_i log p_i`` (0 for uniform use, log |K| when
  one slot takes everything).

With ``memory_usage.staleness`` it repeats this for every checkpoint the run
kept and reports, per layer, how many slots were last a top-1 at each
checkpoint (Kim & Jung's Figure 2; 'never' for slots no checkpoint used).
Writes ``<workdir>/memory_usage.json`` and ``memory_usage.png`` (per layer,
the histogram of read counts over slots, and the staleness bars).
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from memjax import errors
from memjax.checkpoints import checkpointing
from memjax.checkpoints import runfiles
from memjax.data import corpus as corpus_lib
from memjax.eval import rows
from memjax.eval import scorer as scorer_lib
from memjax.io import console
from memjax.io import paths
from memjax.methods.pkm import class_usage
from memjax.methods.pkm import config as pkm_config
from memjax.methods.pkm import counts
from memjax.methods.pkm import layer as pkm_layer
from memjax.models import variables as model_vars
from memjax.run import restore
from memjax.run import spec

KEYS = ("reads", "top1", "weights")
# The sums of ``metrics`` per ``memory_usage.count``: the counts per token
# (Kim & Jung's definition), or every head's.
COUNT_KEYS = {
    "token": KEYS,
    "head": ("reads_per_head", "top1_per_head", "weights"),
}


def slot_sums(
    scorer: Any,
    params: Any,
    tokens: np.ndarray,
    window_len: int,
    batch_size: int,
    max_tokens: int = 0,
) -> dict[str, dict[str, np.ndarray]]:
  """Per memory layer ('layer_1/ffn/memory'), the per-slot sums [|K|] of
  u', t', w' over the whole windows of ``tokens`` (``scorer``: the run's
  ``memjax.eval`` scorer, which runs the model over the windows; a last
  partial batch of windows is left out, so no padding is counted)."""
  if max_tokens:
    tokens = tokens[:max_tokens]
  dp = rows.data_parallel(scorer.mesh)
  batch_size = max(dp, batch_size // dp * dp)
  n = len(tokens) // window_len
  windows = np.asarray(tokens[: n * window_len], np.int32).reshape(n, -1)
  if n < batch_size:
    batch_size = n // dp * dp
  if batch_size < 1:
    raise errors.ConfigError(
        f"memory_usage.split holds {len(tokens)} tokens: too few for one "
        f"window of eval.window_len {window_len} per data-parallel device"
    )
  out = scorer.rows(
      params,
      {"inputs": windows},
      batch_size=batch_size,
      collections=(pkm_layer.USAGE_COLLECTION,),
      drop_remainder=True,
  )
  return model_vars.module_sums(out[pkm_layer.USAGE_COLLECTION])


def metrics(
    sums: dict[str, np.ndarray], count: str = "token"
) -> dict[str, float]:
  """MU, top-1 MU, KL_u, KL_w (and the reads counted) of one layer's sums,
  u' and t' counted per ``count`` ('token' or 'head', ``COUNT_KEYS``)."""
  keys = COUNT_KEYS[count]
  m = counts.usage_metrics(*(np.asarray(sums[k], np.float32) for k in keys))
  out = {k: float(v) for k, v in m.items()}
  out["slots"] = int(len(sums[keys[0]]))
  out["reads"] = float(np.sum(sums[keys[0]]))
  return out


def check_count(count: str) -> None:
  """Raises ConfigError unless ``memory_usage.count`` is one of COUNT_KEYS."""
  if count not in COUNT_KEYS:
    raise errors.ConfigError(
        f"memory_usage.count must be one of {', '.join(COUNT_KEYS)}, got "
        f"{count!r}"
    )


def staleness(
    top1_by_step: dict[int, np.ndarray],
) -> dict[str, int]:
  """{checkpoint step or 'never': slots last used as top-1 there}."""
  steps = sorted(top1_by_step)
  last = np.full(len(top1_by_step[steps[0]]), -1)
  for i, s in enumerate(steps):
    last[top1_by_step[s] > 0] = i
  out = {"never": int(np.sum(last < 0))}
  out.update({str(s): int(np.sum(last == i)) for i, s in enumerate(steps)})
  return out


def _steps(path: str, all_steps: bool) -> list[int]:
  files = runfiles.find(path)
  if files.kind != "run" or not all_steps:
    return [-1]
  # Only listed here; the restore checks each step's signature.
  ckpt = checkpointing.Checkpointer(
      files.checkpoints, keep=1, signature={}, create=False
  )
  try:
    return list(ckpt.all_steps())
  finally:
    ckpt.close()


def memory_usage(run: spec.Run) -> dict[str, Any]:
  """``--mode=memory_usage``: usage metrics per memory layer (module doc)."""
  s, workdir = run.settings, run.workdir
  u = s.of(pkm_config.MemoryUsage)
  check_count(u.count)
  top1_key = COUNT_KEYS[u.count][1]
  source = run.source()
  corpus = corpus_lib.load_corpus(
      s.data, s.eval, workdir, (u.split,), train=False
  )
  tokens = corpus.splits[u.split].tokens
  results: dict[str, Any] = {"split": u.split, "count": u.count, "layers": {}}
  top1_by_step: dict[str, dict[int, np.ndarray]] = {}
  reads = {}
  scorer = None
  for step in _steps(source, bool(u.staleness)):
    restored = restore.restore(
        run,
        runfiles.find(paths.resolve(source)),
        step=None if step < 0 else step,
    )
    start = time.time()
    # One scorer, so one compilation, for every checkpoint of the run.
    scorer = scorer or scorer_lib.scorer_for(restored.scoring())
    sums = slot_sums(
        scorer,
        restored.variables,
        tokens,
        s.eval.window_len,
        s.eval.batch_size,
        int(u.max_tokens),
    )
    if not sums:
      raise errors.ConfigError(
          f"the model of {source} has no product-key memory layer "
          "(model.feed_forward 'pkm' or 'resm')"
      )
    for name, layer in sums.items():
      top1_by_step.setdefault(name, {})[restored.step] = layer[top1_key]
      results["layers"][name] = metrics(layer, u.count)
      reads[name] = layer[COUNT_KEYS[u.count][0]]
    results["step"] = restored.step
    console.info(
        "memory usage at step %d (%.1fs): %s",
        restored.step,
        time.time() - start,
        "; ".join(
            f"{k}: MU {v['mu']:.3f} top-1 MU {v['top1_mu']:.3f} "
            f"KL_u {v['kl_u']:.3f} KL_w {v['kl_w']:.3f}"
            for k, v in results["layers"].items()
        ),
    )
  if u.staleness:
    results["staleness"] = {k: staleness(v) for k, v in top1_by_step.items()}
  paths.makedirs(workdir)
  if jax.process_index() == 0:
    path = paths.join(workdir, "memory_usage.json")
    paths.write_json(path, results)
    results["results_path"] = path
    results["plot"] = plot(results, reads, workdir)
  results["summary_lines"] = [
      f"{k}: MU {v['mu']:.4f}, top-1 MU {v['top1_mu']:.4f}, KL_u "
      f"{v['kl_u']:.4f}, KL_w {v['kl_w']:.4f} ({v['slots']} slots)"
      for k, v in results["layers"].items()
  ] + [f"plot: {results.get('plot', '')}"]
  return results


def plot(results: dict[str, Any], reads: dict[str, np.ndarray], workdir: str):
  """Writes memory_usage.png: per layer, slots by read count (and, with
  staleness, slots by the last checkpoint that used them as top-1)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  layers = sorted(reads)
  rows = 2 if "staleness" in results else 1
  fig, axes = plt.subplots(
      rows, len(layers), figsize=(4 * len(layers), 3 * rows), squeeze=False
  )
  for j, layer in enumerate(layers):
    m = results["layers"][layer]
    ax = axes[0][j]
    ax.hist(reads[layer], bins=50)
    ax.set_yscale("log")
    ax.set_xlabel("reads per slot")
    ax.set_ylabel("slots")
    ax.set_title(
        f"{layer.split('/')[0]}: MU {m['mu']:.2f}, top-1 {m['top1_mu']:.2f}",
        fontsize=9,
    )
    if rows == 2:
      st = results["staleness"][layer]
      axes[1][j].bar(list(st), list(st.values()))
      axes[1][j].set_xlabel("last checkpoint used as top-1")
      axes[1][j].set_ylabel("slots")
  fig.tight_layout()
  path = paths.join(workdir, "memory_usage.png")
  paths.savefig(fig, path, dpi=100)
  plt.close(fig)
  return path


def top1_by_layer(sums: Any) -> dict[str, np.ndarray]:
  """{memory layer: top-1 counts [|K|]} of summed 'pkm_usage' sums."""
  return {k: v["top1"] for k, v in model_vars.module_sums(sums).items()}


# What evaluation reports of the memory layers (``memjax.models.variables.SumReport``):
# the MLM and classification tasks add it to their results under 'memory',
# and the classifier compares the top-1 usage of its two classes.
REPORT = model_vars.SumReport(
    collection=pkm_layer.USAGE_COLLECTION,
    key="memory",
    metrics=metrics,
    scalars=("mu", "top1_mu", "kl_u", "kl_w"),
    brief=lambda m: f"top-1 MU {m['top1_mu']:.3f} KL_u {m['kl_u']:.3f}",
    describe=lambda m: (
        f"MU {m['mu']:.4f}, top-1 MU {m['top1_mu']:.4f}, KL_u "
        f"{m['kl_u']:.4f}, KL_w {m['kl_w']:.4f}"
    ),
    compare=lambda a, b: class_usage.compare(
        top1_by_layer(a), top1_by_layer(b)
    ),
    describe_comparison=lambda d: (
        f"top-1 KL {d.get('kl', float('nan')):.3f}, IOU "
        f"{d.get('iou', float('nan')):.3f}"
    ),
)
