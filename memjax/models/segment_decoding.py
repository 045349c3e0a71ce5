"""Decoding by segments, the recurrent memory carried (``Sampler``): the
models without a key/value cache (LaMemo, 'rpe', MARGE), and the reference
Transformer-XL's cached decoding is tested against.

How the memory is carried: by segments, exactly as in training and
evaluation. The text is cut into segments of T tokens (``eval.segment_len``
or ``data.seq_len``). Completed segments live only in the memory (M =
``generate.mem_len`` or ``model.mem_len``); the current, partial segment of
k tokens (1 <= k <= T) is run with that memory, padded to T, and the next
token is drawn from position k - 1 (attention is causal, and LaMemo's
look-ahead reads only the segment's first token, so the padding changes
nothing). When the segment is full and the next token has been drawn, the
segment is committed: the model runs it once more to update the memory
(Transformer-XL's push, LaMemo's look-ahead refresh and interpolation), and
the new token starts the next segment. Every token is therefore predicted
with the context it would have in a recurrent evaluation. Each step costs one
forward pass over M + T rows; two programs are compiled (predict, commit).

Models without memory (Transformer+RPE) slide a window of the last T
tokens instead, re-encoded at every step. A decoder LM with the 'vanilla'
kind, or Transformer-XL with its memory, decodes with a key/value cache
instead (``memjax.models.lm_decoding``: the prompt whole in one call, then
one cached step per token, the same PRNG keys).

Tokens are chosen as the cached decoder chooses them
(``sampling.Sampling``: top-p and temperature), token t with
``fold_in(PRNGKey(seed), t)``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memjax import errors
from memjax.models import sampling as sampling_lib
from memjax.models import variables as model_vars

Array = jax.Array


class Sampler:
  """Token-by-token sampling with the memory carried by segments."""

  def __init__(
      self, model, segment_len: int, *, top_p: float, temperature: float = 1.0
  ):
    """Creates the sampler.

    Args:
      model: a ``TransformerLM`` (with its memory length set).
      segment_len: T.
      top_p: nucleus mass.
      temperature: divides the log-probabilities before filtering.
    """
    self.model = model
    self.segment_len = int(segment_len)
    self.top_p = float(top_p)
    self.temperature = float(temperature)
    self.recurrent = model.carries_memory()

    def log_probs(params, memory, segment, k):
      def fn(mdl, segment, memory):
        out = mdl(segment, None, memory, deterministic=True)
        h = jax.lax.dynamic_index_in_dim(
            out.hidden, k - 1, axis=1, keepdims=False
        )  # [1, D]
        return mdl.log_probs(h)[0]

      return model.apply(
          model_vars.as_variables(params), segment, memory, method=fn
      )

    def commit(params, memory, segment):
      return model.apply(
          model_vars.as_variables(params),
          segment,
          None,
          memory,
          deterministic=True,
      ).memory

    self._log_probs = jax.jit(log_probs)
    self._commit = jax.jit(commit)
    # One row of the cached decoder's sampling (top-p, temperature).
    sampling = sampling_lib.Sampling(
        top_p=self.top_p, temperature=self.temperature
    )
    sampling.check()
    self._sample = jax.jit(
        lambda logp, key: sampling.choose(logp[None], key[None])[0]
    )

  def run(
      self,
      params: Any,
      prompt: Sequence[int],
      num_steps: int,
      choose: Callable[[int, Array], int],
      stop_ids: Sequence[int] = (),
  ) -> list[Array]:
    """Predicts ``num_steps`` next tokens after ``prompt``, one at a time.

    Args:
      params: model parameters.
      prompt: n >= 1 token ids.
      num_steps: how many next tokens to predict.
      choose: ``choose(t, log_probs [V]) -> token`` picks token t (sampling,
        or the known next token for scoring).
      stop_ids: ids that end the run once chosen.

    Returns:
      The log-probability vectors [V] the choices were made from:
      ``num_steps``, fewer when a stop id was chosen.
    """
    buffer = [int(t) for t in prompt]
    if not buffer:
      raise errors.ConfigError("generate.prompt_len must be >= 1")
    t_len = self.segment_len
    memory = self.model.init_memory(1)

    def settle(buffer, memory):
      """Commits full segments so that 1 <= len(buffer) <= T."""
      while len(buffer) > t_len:
        if self.recurrent:
          memory = self._commit(
              params, memory, jnp.asarray([buffer[:t_len]], jnp.int32)
          )
          buffer = buffer[t_len:]
        else:
          buffer = buffer[-t_len:]
      return buffer, memory

    buffer, memory = settle(buffer, memory)
    stop = {int(i) for i in stop_ids}
    out = []
    for t in range(num_steps):
      k = len(buffer)
      segment = np.zeros((1, t_len), np.int32)
      segment[0, :k] = buffer
      logp = self._log_probs(params, memory, jnp.asarray(segment), jnp.int32(k))
      out.append(logp)
      chosen = int(choose(t, logp))
      if chosen in stop:
        break
      buffer, memory = settle(buffer + [chosen], memory)
    return out

  def generate(
      self,
      params: Any,
      prompt: np.ndarray,
      num_tokens: int,
      seed: int,
      stop_ids: Sequence[int] = (),
  ) -> np.ndarray:
    """Returns [<= num_tokens] int32 tokens that continue ``prompt``
    [n >= 1]: ``num_tokens``, or up to and with the first of ``stop_ids``
    drawn."""
    key = jax.random.PRNGKey(seed)
    tokens = []

    def choose(t, logp):
      tokens.append(int(self._sample(logp, jax.random.fold_in(key, t))))
      return tokens[-1]

    self.run(
        params, np.asarray(prompt).reshape(-1), num_tokens, choose, stop_ids
    )
    return np.asarray(tokens, np.int32)

  def score(self, params: Any, tokens: np.ndarray) -> np.ndarray:
    """[n - 1] float32 log p(tokens[i + 1] | tokens[:i + 1]), predicted the
    way ``generate`` predicts (for checking it against evaluation)."""
    tokens = np.asarray(tokens).reshape(-1)
    logps = self.run(
        params, tokens[:1], len(tokens) - 1, lambda t, _: int(tokens[t + 1])
    )
    return np.asarray(
        [float(lp[tokens[t + 1]]) for t, lp in enumerate(logps)], np.float32
    )
