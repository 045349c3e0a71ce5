"""TRIMEMT_ext training (TRIME paper, Section 5.4, Appendix C).

The objective ``trime_mt``: Eq. 5 on the decoder's positions, where the
memory of a target position is every (g_j, y_j) of the *other* target
sentences of the batch (no local or long memory: translation is a
sentence-level task), with the LM's similarity g . g_j / sqrt(d):

    p(y | x, y_<t) = (exp(s_y) + sum_{j other rows, y_j = y} exp(sim))
                     / (Z_vocab + sum_{j other rows} exp(sim)).

The authors' recipe (princeton-nlp/TRIME ``machine_translation/README.md``
158-174 and ``fairseq/criterions/trime_mt_loss.py``) differs from the text
in two settings, both options of the objective:

* ``temperature`` tau divides the memory logits, g . g_j / (sqrt(d) tau)
  (``--temp 10.0``, ``compute_sim`` 52-65 and line 118); 1 is the text's.
* ``topk_memory`` k: only the k most similar in-batch tokens of other
  sentences enter each query's memory, in the numerator and the normaliser
  alike (``--topk-mem 8``, ``compute_in_bacth_logits`` 136-139); 0 keeps
  every one (the text). Top-k runs on a dense [tokens, tokens] similarity
  of the batch.

``configs/trime_iwslt.py``'s trime_mt variants take the authors' values
(tau 10, k 8, no label smoothing).

Label smoothing (fairseq's, eps_i = eps / (V - 1)) smooths the vocabulary
term only: the loss per token is

    (1 - eps - eps_i) * (-log p_TRIME(y)) + eps_i * sum_v(-log p_vocab(v)),

because the uniform part of label smoothing is a prior over the vocabulary;
spreading it over memory entries would reward putting mass on every
in-batch neighbour regardless of its token. With an empty memory this is
exactly ``label_smoothed``.

The batcher ``tokens_bm25``: the ``tokens`` batcher whose batches hold
target sentences packed by BM25 over targets (Algorithm 1,
``memjax.methods.trime.bm25``), so the in-batch memory resembles the neighbours the
datastore returns at test time.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax import losses
from memjax import settings as settings_lib
from memjax.data import token_batching
from memjax.io import console
from memjax.io import paths
from memjax.memory import blockwise
from memjax.methods.trime import bm25
from memjax.methods.trime import config as trime_config
from memjax.methods.trime import in_batch as trime
from memjax.tasks import config as task_config

Array = jax.Array

_OPTIONS = ("epsilon", "temperature", "topk_memory")


def topk_memory_log_prob(
    output: Any,
    targets: Array,
    weights: Array,
    *,
    k: int,
    temperature: float,
    stop_gradient_memory: bool,
) -> Array:
  """Eq. 5 over the k most similar tokens of the batch's other sentences.

  The authors' ``compute_in_bacth_logits`` with ``topk_mem``: per query,
  the logits g . g_j / (sqrt(d) tau) of every non-padding token of another
  row, their top k, and p = (exp(s_y) + sum_{top k, y_j = y} exp(m_j)) /
  (Z + sum_{top k} exp(m_j)).

  Args:
    output: features [B, T, D], target_logprob and log_z [B, T].
    targets: [B, T] int.
    weights: [B, T], 0 on padding.
    k: memory entries per query.
    temperature: tau.
    stop_gradient_memory: no gradient into the keys.

  Returns:
    [B, T] float32 log p(y).
  """
  b, t, d = output.features.shape
  g = output.features.reshape(b * t, d).astype(jnp.float32)
  keys = jax.lax.stop_gradient(g) if stop_gradient_memory else g
  y = targets.reshape(-1)
  row = jnp.repeat(jnp.arange(b), t)
  sim = (g @ keys.T) / (jnp.sqrt(float(d)) * temperature)  # [Q, Q]
  vis = (row[:, None] != row[None, :]) & (weights.reshape(-1) > 0)[None, :]
  top, idx = jax.lax.top_k(jnp.where(vis, sim, -jnp.inf), min(k, b * t))
  ok = jnp.isfinite(top)
  lse_all = blockwise.masked_logsumexp(top, ok)
  lse_pos = blockwise.masked_logsumexp(top, ok & (y[idx] == y[:, None]))
  logp = trime.combine_log_prob(
      output.target_logprob.reshape(-1),
      output.log_z.reshape(-1),
      lse_all,
      lse_pos,
  )
  return logp.reshape(b, t)


def trime_mt_loss(
    output: Any,
    batch: dict[str, Array],
    *,
    epsilon: float,
    block_size: int | None,
    stop_gradient_memory: bool,
    temperature: float = 1.0,
    topk_memory: int = 0,
) -> tuple[Array, dict[str, Array]]:
  """The smoothed TRIME loss of a batch of target sentences.

  Args:
    output: a ``seq2seq.Seq2SeqOutput`` (features [B, T, D],
      target_logprob / log_z / mean_logprob [B, T]).
    batch: 'targets' [B, T] int32 and 'weights' [B, T] (0 on padding).
    epsilon: label smoothing.
    block_size: blockwise tiles of the memory sums (None: dense).
    stop_gradient_memory: stop the gradient into the memory keys.
    temperature: divides the memory logits (the authors' ``--temp``).
    topk_memory: k most similar in-batch entries per query (the authors'
      ``--topk-mem``); 0 = all.

  Returns:
    (mean smoothed loss per target token, metrics as ``losses``).
  """
  w = losses.batch_weights(batch)
  if topk_memory > 0:
    logp = topk_memory_log_prob(
        output,
        batch["targets"],
        w,
        k=topk_memory,
        temperature=temperature,
        stop_gradient_memory=stop_gradient_memory,
    )
  else:
    logp = trime.trime_log_prob(
        output.features,
        output.target_logprob,
        output.log_z,
        batch["targets"],
        w,
        spec=trime.MemorySpec.external(hide_local=True),
        temperature=temperature,
        block_size=block_size,
        stop_gradient_memory=stop_gradient_memory,
    )
  v = output.vocab_size
  eps_i = epsilon / (v - 1)
  nll = -logp
  smooth = -output.mean_logprob * v
  per_token = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
  total = jnp.sum(jnp.where(w > 0, per_token * w, 0.0))
  tokens = jnp.sum(w)
  stop = jax.lax.stop_gradient
  return total / jnp.maximum(tokens, 1.0), {
      "nll_sum": total,
      "tokens": tokens,
      "aux_nll_sum": stop(jnp.sum(jnp.where(w > 0, nll * w, 0.0))),
      # What the vocabulary alone would pay (no memory).
      "aux_lm_loss_sum": stop(
          jnp.sum(jnp.where(w > 0, -output.target_logprob * w, 0.0))
      ),
  }


def make_trime_mt_loss(
    s: settings_lib.Settings, num_steps: int
) -> losses.LossFn:
  """TRIMEMT_ext's objective (module docstring).

  Settings: ``loss.options.epsilon`` (label smoothing, 0.1),
  ``loss.options.temperature`` (tau of the memory logits, 1),
  ``loss.options.topk_memory`` (k in-batch entries per query, 0 = all),
  ``trime.lm_warmup_fraction`` (the first updates train with
  ``label_smoothed`` alone), ``trime.block_size`` (0 = dense) and
  ``trime.stop_gradient_memory``.
  """
  cfg = s.of(trime_config.Trime)
  options = dict(s.loss.options or {})
  unknown = sorted(set(options) - set(_OPTIONS))
  if unknown:
    raise errors.ConfigError(
        f"loss.options has {', '.join(unknown)}, which objective 'trime_mt' "
        f"does not take; its options: {', '.join(_OPTIONS)}"
    )
  eps = float(options.get("epsilon", 0.1))
  if not 0.0 <= eps < 1.0:
    raise errors.ConfigError(f"loss.options.epsilon must be in [0, 1): {eps}")
  temp = float(options.get("temperature", 1.0))
  topk = int(options.get("topk_memory", 0))
  if temp <= 0 or topk < 0:
    raise errors.ConfigError(
        "loss.options.temperature must be > 0 and loss.options.topk_memory "
        f">= 0, got {temp} and {topk}"
    )
  frac = float(cfg.lm_warmup_fraction)
  if not 0.0 <= frac <= 1.0:
    raise errors.ConfigError(
        f"trime.lm_warmup_fraction must be in [0, 1], got {frac}"
    )
  warmup = int(round(frac * num_steps))
  block_size = int(cfg.block_size) or None
  stop_memory = bool(cfg.stop_gradient_memory)
  # The warm-up's plain objective takes only the smoothing of the options.
  smoothing = {k: v for k, v in options.items() if k == "epsilon"}
  plain = losses.make_label_smoothed_loss(
      s.replace(dataclasses.replace(s.loss, options=smoothing)), num_steps
  )

  def loss_fn(output, batch, *, step, rng):
    def with_memory(_):
      return trime_mt_loss(
          output,
          batch,
          epsilon=eps,
          block_size=block_size,
          stop_gradient_memory=stop_memory,
          temperature=temp,
          topk_memory=topk,
      )

    def without(_):
      loss, metrics = plain(output, batch, step=step, rng=rng)
      w = losses.batch_weights(batch)
      lm = jnp.sum(jnp.where(w > 0, -output.target_logprob * w, 0.0))
      return loss, dict(metrics, aux_lm_loss_sum=jax.lax.stop_gradient(lm))

    if warmup <= 0:
      return with_memory(None)
    return jax.lax.cond(step >= warmup, with_memory, without, None)

  return loss_fn


def target_order(
    targets: Sequence[np.ndarray], k: int, seed: int, cache_dir: str
) -> np.ndarray:
  """Algorithm 1's order of the target sentences (BM25 over targets, the
  whole sentence as the query), cached in ``<cache_dir>/bm25``.

  Args:
    targets: the training targets' ids (each ending in EOS, which is dropped
      from the bag of words).
    k: BM25 hits per query.
    seed: seeds Algorithm 1's random starts.
    cache_dir: the run's cache directory ('' = no cache).

  Returns:
    [S] int64, a permutation of the sentences.
  """
  segs = [np.asarray(t[t > 1] if len(t) else t, np.int32) for t in targets]
  h = hashlib.sha256()
  for s in segs:
    h.update(np.int64(len(s)).tobytes())
    h.update(s.tobytes())
  h.update(f"k={k},seed={seed},v={bm25._FORMAT_VERSION}".encode())  # pylint: disable=protected-access
  path = ""
  if cache_dir:
    path = paths.join(cache_dir, "bm25", f"targets_{h.hexdigest()[:32]}.npy")
    if paths.exists(path):
      return paths.np_load(path)
  neighbours = bm25.bm25_neighbours(segs, k, show_progress=False)
  order, restarts = bm25.pack_from_neighbours(neighbours, seed)
  console.info(
      "BM25 packing of %d target sentences: %d random restarts",
      len(order),
      restarts,
  )
  if path:
    paths.makedirs(paths.dirname(path))
    paths.np_save(path, order)
  return order


class Bm25TokenBatcher(token_batching.TokenBatcher):
  """``TokenBatcher`` whose batches hold BM25-packed target sentences.

  Within each length bucket the pairs keep Algorithm 1's order over the
  whole training set, cut into consecutive batches of ``rows`` pairs, so
  lexically similar targets share a batch; every epoch serves the same
  batches in a new seeded order (as the LM's 'bm25' batcher serves its
  packed segments).
  """

  def __init__(self, source, target, *, order: np.ndarray, **kwargs):
    super().__init__(source, target, **kwargs)
    rank = np.empty(len(order), np.int64)
    rank[np.asarray(order)] = np.arange(len(order))
    self.members = [m[np.argsort(rank[m], kind="stable")] for m in self.members]

  def _epoch_plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    if epoch != self._plan_epoch:
      plan = []
      for m, b in zip(self.members, self.buckets):
        r = self.rows[b]
        plan += [(b, m[i : i + r]) for i in range(0, len(m), r)]
      rng = np.random.default_rng([self.seed, epoch])
      self._plan = [plan[i] for i in rng.permutation(len(plan))]
      self._plan_epoch = epoch
    return self._plan


def make_bm25_token_batcher(
    s: settings_lib.Settings, train: Any, cache_dir: str
) -> Bm25TokenBatcher:
  """The 'tokens_bm25' batcher over a ``parallel.ParallelSplit``
  (``trime.bm25_k`` hits per query, ``trime.bm25_seed``)."""
  t, b = s.of(task_config.Translation), s.of(trime_config.Trime)
  if int(b.bm25_k) < 1:
    raise errors.ConfigError(f"trime.bm25_k must be >= 1, got {b.bm25_k}")
  order = target_order(train.target, int(b.bm25_k), int(b.bm25_seed), cache_dir)
  devices = max(1, jax.device_count() // max(1, int(s.mesh.tensor)))
  return Bm25TokenBatcher(
      train.source,
      train.target,
      order=order,
      max_tokens=int(t.max_tokens),
      buckets=tuple(t.buckets),
      seed=int(s.seed),
      row_multiple=devices,
  )
