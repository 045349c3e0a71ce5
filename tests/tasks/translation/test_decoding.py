"""Greedy and beam search: beam 1 is greedy; on a hand-built model beam
search finds the best hypothesis and greedy does not; the log-prob hook."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.models import seq2seq
from memjax.tasks.translation import decoding

EOS, A, B = 1, 2, 3


class TableModel(nn.Module):
  """p(next | previous token) from a fixed table; no parameters.

  From the start: A 0.6, B 0.4. After A: A 0.4, B 0.3, EOS 0.3 (greedy
  keeps taking A). After B: EOS 0.9, A 0.05, B 0.05. The best hypothesis
  is B EOS (0.36; length-normalised log 0.36 / 2); greedy never ends
  before the length limit.
  """

  max_len: int = 64

  def encode(self, source):
    return jnp.zeros(source.shape + (1,)), source != 0

  def init_cache(self, enc, max_len):
    del max_len
    return {"cross": (), "self": (jnp.zeros((enc.shape[0], 1)),)}

  def decode_step(self, token, pos, cache, src_mask):
    del pos, src_mask
    table = np.full((4, 4), 1e-9)
    table[0, [A, B]] = 0.6, 0.4
    table[A, [A, B, EOS]] = 0.4, 0.3, 0.3
    table[B, [EOS, A, B]] = 0.9, 0.05, 0.05
    logp = jnp.log(jnp.asarray(table / table.sum(1, keepdims=True)))[token]
    return logp.astype(jnp.float32), jnp.zeros((token.shape[0], 2)), cache


SOURCE = jnp.ones((2, 3), jnp.int32)


def test_beam_finds_the_best_hypothesis_and_greedy_does_not():
  m = TableModel()
  greedy = np.asarray(decoding.greedy_search(m, {}, SOURCE, 6))
  np.testing.assert_array_equal(greedy[0], [A, A, A, A, A, EOS])
  res = decoding.beam_search(m, {}, SOURCE, 6, beam_size=2)
  np.testing.assert_array_equal(np.asarray(res.tokens)[0], [B, EOS, 0, 0, 0, 0])
  np.testing.assert_allclose(res.scores[0, 0], np.log(0.4 * 0.9) / 2, rtol=1e-5)
  # Greedy's hypothesis (EOS forced at the limit) scores below it.
  greedy_score = (np.log(0.6) + 4 * np.log(0.4) + np.log(0.3)) / 6
  assert res.scores[0, 0] > greedy_score


def test_hook_adjusts_every_step():
  m = TableModel()

  def ban_b(logp, g, step):
    assert g.shape == (logp.shape[0], 2) and step.shape == ()
    return logp.at[:, B].set(decoding.NEG)

  res = decoding.beam_search(m, {}, SOURCE, 4, beam_size=2, hook=ban_b)
  assert B not in np.asarray(res.hypotheses).tolist()[0][0]
  np.testing.assert_array_equal(np.asarray(res.tokens)[0], [A, EOS, 0, 0])


@pytest.fixture(scope="module")
def tiny():
  m = seq2seq.EncoderDecoder(
      vocab_size=40, encoder_layers=1, num_layers=1, d_model=32,
      num_heads=2, head_dim=16, d_ff=64, max_len=64,
  )  # fmt: skip
  src = np.random.default_rng(0).integers(3, 40, (5, 8)).astype(np.int32)
  src[2, 5:] = 0
  src[:, 7] = np.where(src[:, 6] == 0, 0, EOS)
  init = jax.jit(lambda k: m.init(k, jnp.zeros((1, 4), jnp.int32)))
  p = nn.meta.unbox(init(jax.random.PRNGKey(1))["params"])
  return m, p, jnp.asarray(src)


def test_beam_one_equals_greedy(tiny):
  m, p, src = tiny
  g = jax.jit(lambda p, s: decoding.greedy_search(m, p, s, 10))(p, src)
  b = jax.jit(lambda p, s: decoding.beam_search(m, p, s, 10, 1))(p, src)
  np.testing.assert_array_equal(np.asarray(g), np.asarray(b.tokens))


def test_beam_scores_are_length_normalised_log_probs(tiny):
  m, p, src = tiny
  res = jax.jit(lambda p, s: decoding.beam_search(m, p, s, 10, 3))(p, src)
  # Rescore the best hypothesis of each sentence by teacher forcing.
  toks = np.asarray(res.tokens)
  inputs = np.zeros_like(toks)
  inputs[:, 1:] = toks[:, :-1]
  out = jax.jit(lambda p, i, t, s: m.apply({"params": p}, i, t, source=s))(
      p, jnp.asarray(inputs), jnp.asarray(toks), src
  )
  lengths = np.argmax(toks == EOS, axis=1) + 1
  mask = np.arange(toks.shape[1])[None] < lengths[:, None]
  total = np.sum(np.asarray(out.target_logprob) * mask, axis=1)
  np.testing.assert_allclose(
      res.scores[:, 0], total / lengths, rtol=1e-4, atol=1e-5
  )
