"""Shared test helpers: small model settings, random parameters and a
jitted apply."""

import flax
import jax
import jax.numpy as jnp
import numpy as np

from memjax import build
from memjax import settings
from memjax.models import block_stack

# A small model: the settings where the tests' models differ from
# ``settings.Model``'s defaults (a plain softmax, no dropout).
SMALL = dict(
    num_layers=2,
    d_model=64,
    num_heads=2,
    head_dim=32,
    d_ff=256,
    cutoffs=(),
    scale_embedding=False,
    dropout=0.0,
)


def config(vocab_size, parts=None, **model):
  """The ``ModelConfig`` of a small model (``SMALL``) with the
  ``settings.Model`` keys ``model`` (kinds by name: ``attention='xl'``),
  its kinds looked up in ``parts`` (default: the catalog's)."""
  given = settings.Model(**dict(SMALL, **model))
  return block_stack.ModelConfig.of(
      given, vocab_size=vocab_size, parts=parts or build.parts()
  )


# A tiny one: one layer of width 16, two heads of 8.
TINY = dict(num_layers=1, d_model=16, num_heads=2, head_dim=8, d_ff=32)


def tiny(vocab_size, parts=None, **model):
  """``config`` of a tiny model (``TINY``) with the keys ``model``."""
  return config(vocab_size, parts, **dict(TINY, **model))


def random_params(module, x, memory, seed=0, scale=0.4):
  """Parameters of ``module`` drawn from N(0, scale^2), all of them (the
  biases included), so that every term of the score matters. Shapes come
  from ``jax.eval_shape``, so nothing is compiled."""
  shapes = flax.core.meta.unbox(
      jax.eval_shape(
          lambda: module.init(jax.random.key(0), x, memory, deterministic=True)
      )
  )
  rng = np.random.default_rng(seed)
  return jax.tree_util.tree_map(
      lambda s: jnp.asarray(scale * rng.normal(size=s.shape), s.dtype), shapes
  )


def apply(module, params, x, memory):
  """Jitted deterministic apply; returns (y, new_memory, intermediates)."""
  fn = jax.jit(
      lambda p, x, m: module.apply(
          p, x, m, deterministic=True, mutable=["intermediates"]
      )
  )
  (y, new_memory), state = fn(params, x, memory)
  return y, new_memory, state.get("intermediates", {})


def normal(seed, shape, scale=1.0):
  """A float32 standard-normal array from NumPy (compiles nothing)."""
  rng = np.random.default_rng(seed)
  return jnp.asarray(scale * rng.normal(size=shape), jnp.float32)


def recurrent_log_probs(model, variables, tokens, segment_len):
  """[n, V] float32 log-probabilities after each of ``tokens`` [n], as
  recurrent evaluation gives them: segments of T from the first token (the
  last one padded: attention is causal), the model's memory carried."""
  from memjax.models import variables as model_vars  # pylint: disable=g-import-not-at-top

  n, t = len(tokens), int(segment_len)
  x = np.zeros((1, -(-n // t) * t), np.int32)
  x[0, :n] = tokens

  def fn(mdl, seg, memory):
    out = mdl(seg, None, memory, deterministic=True)
    return mdl.log_probs(out.hidden), out.memory

  step = jax.jit(
      lambda s, m: model.apply(
          model_vars.as_variables(variables), s, m, method=fn
      )
  )
  memory, out = model.init_memory(1), []
  for s in range(0, x.shape[1], t):
    lp, memory = step(x[:, s : s + t], memory)
    out.append(np.asarray(lp[0]))
  return np.concatenate(out)[:n]


def window_log_probs(model, variables, tokens, window_len, score_len, bos):
  """[n - 1, V] float32 log-probabilities of each prediction of
  ``tokens`` [n], as evaluation's sliding windows give them
  (``data.windows.eval_windows``; BOS first in a window after the first
  where ``bos`` is an id)."""
  from memjax.data import windows  # pylint: disable=g-import-not-at-top
  from memjax.models import variables as model_vars  # pylint: disable=g-import-not-at-top

  def fn(mdl, x):
    return mdl.log_probs(mdl(x, None, None, deterministic=True).hidden)

  out = None
  for start, length, first in windows.eval_windows(
      len(tokens) - 1, window_len, score_len
  ):
    x = np.array(tokens[start : start + length], np.int32)
    if bos is not None and start > 0:
      x[0] = bos
    lp = np.asarray(
        model.apply(model_vars.as_variables(variables), x[None], method=fn)[0]
    )
    if out is None:
      out = np.zeros((len(tokens) - 1, lp.shape[-1]), np.float32)
    out[start + first : start + length] = lp[first:]
  return out
