"""Attention analyses of recurrent-memory models (LaMemo paper, Figures 1, 6).

``analyze(run)`` (``--mode=analyze``) restores the latest
checkpoint, runs it over the first ``analyze.num_segments`` segments of every
lane of ``analyze.split`` (segments and memory as in evaluation, the memory
carried), reads the layers' ``sow`` intermediates and writes:

* ``alpha.npy`` [layers, M] float64 and ``alpha.png`` (LaMemo only): the
  interpolation weight of the old memory, alpha of Eq. 10-11, per layer and
  memory slot (slot 0 is the oldest), averaged over heads, lanes and
  segments, counting only valid slots (Figure 6).
* ``attention_by_distance.npy`` [layers, M + T] float64 and
  ``attention_by_distance.png``: the mean attention weight a query puts on
  the key d positions back (d = 0 is the query itself), averaged over heads,
  scored queries and segments, counting only (query, key) pairs where the key
  exists and is valid (Figure 1 shows the same attention on the context by
  distance). Distances d >= T reach only the memory.
* ``analysis.json``: the settings, the mean attention mass a query puts on
  the memory per layer, and the mean alpha per layer.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax.data import corpus as corpus_lib
from memjax.eval import streams as streams_eval
from memjax.io import console
from memjax.io import paths
from memjax.methods.recurrent import config as recurrent_config
from memjax.models import layer_layout
from memjax.models import variables as model_vars
from memjax.run import restore
from memjax.run import spec

Array = jax.Array


def attention_by_distance(
    probs: Array, key_valid: Array, query_weight: Array, mem_len: int
) -> tuple[Array, Array]:
  """Sums of attention weights per relative distance.

  Args:
    probs: [B, H, T, M + T] float32 attention of query i over key j
      (key j of query i is M + i - j positions back).
    key_valid: [B, M + T] bool.
    query_weight: [B, T] float32, 0 for queries not to count (padding).
    mem_len: M.

  Returns:
    (sums [M + T] float32 of the weights at distance d, counts [M + T]
     float32 of the (lane, head, query) triples that have a valid key at
     distance d).
  """
  _, heads, seg_len, total = probs.shape
  dist = jnp.arange(total)
  key = mem_len + jnp.arange(seg_len)[:, None] - dist[None, :]  # [T, K]
  exists = (key >= 0) & (key < total)
  key = jnp.clip(key, 0, total - 1)
  gathered = jnp.take_along_axis(
      probs, jnp.broadcast_to(key, probs.shape), axis=-1
  )  # [B, H, T, K]
  mask = (exists[None] & key_valid[:, key]).astype(jnp.float32)
  mask = mask * query_weight[:, :, None]  # [B, T, K]
  sums = jnp.einsum("bhtk,btk->k", gathered, mask)
  counts = heads * jnp.sum(mask, axis=(0, 1))
  return sums, counts


class AttentionAnalyzer(streams_eval.StreamScorer):
  """Runs a model over segments and sums alpha and attention by distance."""

  def _step(
      self, params: Any, memory: Any, segment: dict[str, Array]
  ) -> tuple[Any, dict[str, Array]]:
    memory = self.model.reset_memory(memory, segment["reset"])
    out, state = self.model.apply(
        model_vars.as_variables(params),
        segment["inputs"],
        segment["targets"],
        memory=memory,
        deterministic=True,
        mutable=["intermediates"],
    )
    inter = layer_layout.unstack_layers(dict(state["intermediates"]))
    mem_valid = memory[0].valid  # [B, M]
    batch, seg_len = segment["inputs"].shape
    key_valid = jnp.concatenate(
        [mem_valid, jnp.ones((batch, seg_len), jnp.bool_)], axis=1
    )
    weight = segment["weights"]
    lane = (weight.sum(axis=1) > 0).astype(jnp.float32)  # real lanes
    dist_sums, dist_counts, alpha_sums, alpha_counts = [], [], [], []
    mem_mass = []
    for i in range(self.model.cfg.num_layers):
      layer = inter[f"layer_{i}"]["attention"]
      probs = layer["attention_probs"][0]  # [B, H, T, M + T]
      s, c = attention_by_distance(probs, key_valid, weight, self.mem_len)
      dist_sums.append(s)
      dist_counts.append(c)
      mem_mass.append(
          jnp.einsum("bhtm,bt->", probs[..., : self.mem_len], weight)
      )
      if "alpha" in layer:
        alpha = layer["alpha"][0]  # [B, M, H]
        slot = mem_valid.astype(jnp.float32) * lane[:, None]
        alpha_sums.append(jnp.einsum("bmh,bm->m", alpha, slot))
        alpha_counts.append(alpha.shape[-1] * jnp.sum(slot, axis=0))
    outputs = {
        "dist_sums": jnp.stack(dist_sums),
        "dist_counts": jnp.stack(dist_counts),
        "memory_mass": jnp.stack(mem_mass),
        "queries": jnp.sum(weight) * probs.shape[1],
    }
    if alpha_sums:
      outputs["alpha_sums"] = jnp.stack(alpha_sums)
      outputs["alpha_counts"] = jnp.stack(alpha_counts)
    return out.memory, outputs

  def analyze(
      self,
      params: Any,
      tokens: np.ndarray,
      num_segments: int,
      desc: str = "analyze",
  ) -> dict[str, np.ndarray]:
    """Returns 'attention_by_distance' [layers, M + T], 'memory_share'
    [layers] (mean attention mass of a query on the memory) and, for LaMemo,
    'alpha' [layers, M] (NaN where nothing was counted)."""
    segments = streams_eval.stacked_segments(
        tokens, self.segment_len, self.lanes, num_segments
    )
    out = self.run_segments(params, segments, desc)
    res = {}
    with np.errstate(invalid="ignore", divide="ignore"):
      res["memory_share"] = (
          out["memory_mass"].astype(np.float64).sum(0)
          / out["queries"].astype(np.float64).sum()
      )
      res["attention_by_distance"] = out["dist_sums"].astype(np.float64).sum(
          0
      ) / out["dist_counts"].astype(np.float64).sum(0)
      if "alpha_sums" in out:
        res["alpha"] = out["alpha_sums"].astype(np.float64).sum(0) / out[
            "alpha_counts"
        ].astype(np.float64).sum(0)
    return res


def _plot_alpha(path: str, alpha: np.ndarray, title: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
  cmap = plt.get_cmap("viridis")
  for i, row in enumerate(alpha):
    ax.plot(
        np.arange(len(row)),
        row,
        color=cmap(i / max(len(alpha) - 1, 1)),
        label=f"layer {i}",
    )
  ax.set_xlabel("memory index (0 = oldest)")
  ax.set_ylabel("alpha (weight of the old memory)")
  ax.set_ylim(0, 1.02)
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  paths.savefig(fig, path)
  plt.close(fig)


def plot_attention_by_distance(
    path: str, curves: dict[str, np.ndarray], seg_len: int, title: str
) -> None:
  """Mean attention weight by distance, one line per curve ([K] arrays)."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, ax = plt.subplots(figsize=(5, 3.6), dpi=120)
  for name, curve in curves.items():
    ax.plot(np.arange(len(curve)), curve, label=name)
  ax.axvline(seg_len, color="grey", lw=0.8, ls="--")
  ax.set_yscale("log")
  ax.set_xlabel(f"distance to the query (>= {seg_len}: memory only)")
  ax.set_ylabel("mean attention weight")
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  paths.savefig(fig, path)
  plt.close(fig)


def analyze(run: spec.Run) -> dict[str, Any]:
  """``--mode=analyze``: alpha and attention by distance (see module doc)."""
  s, workdir = run.settings, run.workdir
  a = s.of(recurrent_config.Analyze)
  restored = restore.restore_source(run)
  corpus = corpus_lib.load_corpus(s.data, s.eval, workdir, train=False)
  split = a.split
  if split not in corpus.splits:
    raise errors.ConfigError(
        f"analyze.split {split!r} is not in eval.splits "
        f"{tuple(s.eval.splits)}"
    )
  model = restored.model.with_settings(remat=False)  # sow outside remat
  analyzer = AttentionAnalyzer(
      dataclasses.replace(restored.scoring(), model=model)
  )
  num = int(a.num_segments)
  res = analyzer.analyze(
      restored.variables,
      corpus.splits[split].tokens,
      num,
      desc=f"analyze {split}",
  )
  title = f"{s.name}, step {restored.step}, {split}"
  files = []
  dist = res["attention_by_distance"]
  path = paths.join(workdir, "attention_by_distance.npy")
  paths.np_save(path, dist)
  files.append(path)
  curves = {f"layer {i}": row for i, row in enumerate(dist)}
  curves["mean"] = np.nanmean(dist, axis=0)
  path = paths.join(workdir, "attention_by_distance.png")
  plot_attention_by_distance(path, curves, analyzer.segment_len, title)
  files.append(path)
  summary: dict[str, Any] = {
      "name": s.name,
      "step": restored.step,
      "split": split,
      "segments_per_lane": num,
      "lanes": analyzer.lanes,
      "segment_len": analyzer.segment_len,
      "mem_len": analyzer.mem_len,
      # Mean attention mass a query puts on the memory, per layer.
      "memory_share_by_layer": [float(x) for x in res["memory_share"]],
  }
  if "alpha" in res:
    path = paths.join(workdir, "alpha.npy")
    paths.np_save(path, res["alpha"])
    files.append(path)
    path = paths.join(workdir, "alpha.png")
    _plot_alpha(path, res["alpha"], title)
    files.append(path)
    summary["alpha_mean_by_layer"] = [
        float(np.nanmean(r)) for r in res["alpha"]
    ]
    for i, a in enumerate(summary["alpha_mean_by_layer"]):
      console.info("layer %d: mean alpha %.3f", i, a)
  path = paths.join(workdir, "analysis.json")
  with paths.open(path, "w") as f:
    json.dump(summary, f, indent=2)
  files.append(path)
  summary["files"] = files
  return summary
