"""The re-indexing step hook of the modified-MARGE LM ('marge_reindex').

Every ``every`` steps (MARGE: 10,000) the hook embeds every training segment
with the current parameters (e(.), ``MargeLM.embed_segments``, jitted, no
gradients: the index is data), writes the embeddings to
``<workdir>/marge_index/step_<step>.npy`` and hands them to the batcher.
It logs staleness: for a fixed probe set of queries, the share of the causal
top-k that changed since the previous index (1.0 at the first index). Its
state (JSON, saved with checkpoints) records the current index file and the
staleness history, so a resumed run retrieves from the same index.

Switch it on with ``train.hooks = ("marge_reindex",)`` and
``train.hook_options.marge_reindex = {"every": I, "probes": 256,
"batch": 256}``.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import sharding as sharding_lib
from memjax.io import paths
from memjax.run import hooks
from memjax.models import variables as model_vars


@functools.lru_cache(maxsize=8)
def _embed_fn(model: Any, mesh: Any) -> Any:
  """The jitted e(.) of ``model`` (cached: every re-indexing of a run
  reuses one compiled program instead of tracing a new closure)."""

  def fn(p, toks):
    e = model.apply(
        model_vars.as_variables(p),
        toks,
        method=lambda mdl, x: mdl.embed_segments(x),
    )
    return jax.lax.stop_gradient(e)

  return jax.jit(fn) if mesh is None else sharding_lib.jit(fn, mesh)


def embed_all(
    model: Any, params: Any, segments: np.ndarray, batch: int, mesh: Any
) -> np.ndarray:
  """e(.) of ``segments`` [M, N] -> [M, D] float32, ``batch`` rows at a
  time (one compiled program: the last chunk is padded)."""
  run = _embed_fn(model, mesh)
  out = []
  for a in range(0, len(segments), batch):
    chunk = segments[a : a + batch]
    m = len(chunk)
    if m < batch:
      chunk = np.concatenate(
          [chunk, np.zeros((batch - m,) + chunk.shape[1:], chunk.dtype)]
      )
    out.append(np.asarray(run(params, jnp.asarray(chunk)))[:m])
  return np.concatenate(out).astype(np.float32)


def staleness(old: np.ndarray, new: np.ndarray) -> float:
  """Share of the top-k ids [Q, k] of ``new`` not in the same row of
  ``old`` (empty slots, -1, ignored)."""
  changed, total = 0, 0
  for a, b in zip(old, new):
    b = b[b >= 0]
    changed += len(set(b.tolist()) - set(a[a >= 0].tolist()))
    total += len(b)
  return changed / max(total, 1)


class MargeReindex(hooks.StepHook):
  """Rebuilds the MARGE index with the current embedder."""

  def _probes(self) -> np.ndarray:
    batcher = self.ctx.batcher
    n = int(self.ctx.options.get("probes", 256))
    rng = np.random.default_rng(self.ctx.settings.seed)
    return np.sort(rng.choice(batcher.table.targets, n))

  def _embedder(self) -> dict[str, Any]:
    """What makes an index comparable: the embedder's settings."""
    m = self.ctx.model
    return dict(
        segment_len=m.segment_len,
        pooling=m.pooling,
        d_model=m.cfg.d_model,
        layers=m.half(),
    )

  def start(self) -> None:
    path = self.state.get("index")
    if not path or not paths.exists(path):
      return
    built = self.state.get("embedder")
    if built is not None and built != self._embedder():
      raise errors.ConfigError(
          f"the MARGE index {path} was built by another embedder ({built}, "
          f"this model: {self._embedder()}); start a new run"
      )
    self.ctx.batcher.use_index(paths.np_load(path))

  def __call__(self, step: int, params: Any) -> None:
    batcher = self.ctx.batcher
    table = batcher.table
    segments = table.segment_tokens(np.arange(len(table)))
    emb = embed_all(
        self.ctx.model,
        params,
        segments,
        int(self.ctx.options.get("batch", 256)),
        self.ctx.mesh,
    )
    probes = self._probes()
    old = batcher.index.topk(probes, batcher.k) if batcher.index else None
    batcher.use_index(emb)
    new = batcher.index.topk(probes, batcher.k)
    stale = 1.0 if old is None else staleness(old, new)
    out_dir = paths.join(self.ctx.workdir, "marge_index")
    path = paths.join(out_dir, f"step_{step}.npy")
    if self.ctx.is_chief:
      paths.makedirs(out_dir)
      paths.np_save(path, np.asarray(emb))
    history = list(self.state.get("staleness", [])) + [[step, stale]]
    beta = float(
        np.asarray(jax.device_get(model_vars.params_of(params)["beta"]))
    )
    self.state.update(index=path, staleness=history, embedder=self._embedder())
    print(
        f"marge_reindex step {step}: {len(table)} segments, staleness "
        f"{stale:.3f} (share of top-{batcher.k} changed), beta {beta:.4f}",
        flush=True,
    )
    if self.ctx.writer is not None:
      self.ctx.writer.write_scalars(
          step, {"marge/staleness": stale, "marge/beta": beta}
      )
    if self.ctx.is_chief:
      with paths.open(paths.join(out_dir, "staleness.json"), "w") as f:
        json.dump(history, f)
