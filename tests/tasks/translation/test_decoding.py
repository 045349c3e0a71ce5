"""Greedy and beam search: beam 1 is greedy; on a hand-built model beam
search finds the best hypothesis and greedy does not; the log-prob hook."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memjax.models import block_stack
from memjax.models import seq2seq
from memjax.tasks.translation import decoding
from tests.models import helpers

EOS, A, B = 1, 2, 3


class TableModel(nn.Module):
  """p(next | previous token) from a fixed table; no parameters.

  From the start: A 0.6, B 0.4. After A: A 0.4, B 0.3, EOS 0.3 (greedy
  keeps taking A). After B: EOS 0.9, A 0.05, B 0.05. The best hypothesis
  is B EOS (0.36; length-normalised log 0.36 / 2); greedy never ends
  before the length limit.
  """

  cfg: block_stack.ModelConfig = block_stack.ModelConfig(max_len=64)

  def encode(self, source):
    return jnp.zeros(source.shape + (1,)), source != 0

  def init_cache(self, enc, max_len):
    del max_len
    return {"cross": (), "self": (jnp.zeros((enc.shape[0], 1)),)}

  def table(self) -> np.ndarray:
    """[4, 4] next-token probabilities (rows: the previous token)."""
    table = np.full((4, 4), 1e-9)
    table[0, [A, B]] = 0.6, 0.4
    table[A, [A, B, EOS]] = 0.4, 0.3, 0.3
    table[B, [EOS, A, B]] = 0.9, 0.05, 0.05
    return table

  def decode_step(self, token, pos, cache, src_mask):
    del pos, src_mask
    table = self.table()
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


@pytest.mark.parametrize("beam", [0, 2])
def test_pad_is_never_picked(beam):
  """A hook that makes pad (id 0) the most likely token at every step: the
  search takes the best other token (fairseq's "never select pad"), so
  the output is the same as with pad banned outright."""
  m = TableModel()
  pad_first = lambda logp, g, step: logp.at[:, 0].set(0.0)  # noqa: E731
  ban_pad = lambda logp, g, step: logp.at[:, 0].set(decoding.NEG)  # noqa: E731

  def run(hook):
    if beam:
      return np.asarray(
          decoding.beam_search(m, {}, SOURCE, 6, beam, hook=hook).tokens
      )
    return np.asarray(decoding.greedy_search(m, {}, SOURCE, 6, hook=hook))

  out = run(pad_first)
  np.testing.assert_array_equal(out, run(ban_pad))
  expected = [B, EOS, 0, 0, 0, 0] if beam else [A, A, A, A, A, EOS]
  np.testing.assert_array_equal(out[0], expected)


@pytest.fixture(scope="module")
def tiny():
  m = seq2seq.EncoderDecoder(
      cfg=helpers.config(
          40,
          num_layers=1,
          d_model=32,
          num_heads=2,
          head_dim=16,
          d_ff=64,
          max_len=64,
          norm_position="post",
          norm_epsilon=1e-5,
      ),
      encoder_layers=1,
  )
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


class FlipModel(TableModel):
  """A table where the length penalty decides the winner (no ties).

  From the start: A 0.6, B 0.4. After A: A 0.45, B 0.3, EOS 0.25. After B:
  EOS 0.9, A 0.06, B 0.04. Beam 2, by hand: step 1 keeps B EOS (0.36,
  finished), A A (0.27), A B (0.18); A EOS (0.15) is the fourth candidate,
  not among the first two, so it is not finished. Step 2: A B EOS (0.162)
  finishes, the second finished hypothesis, and the search stops.
  """

  def table(self) -> np.ndarray:
    table = np.full((4, 4), 1e-7)
    table[0, [A, B]] = 0.6, 0.4
    table[A, [A, B, EOS]] = 0.45, 0.3, 0.25
    table[B, [EOS, A, B]] = 0.9, 0.06, 0.04
    return table


def _flip_nbest(lenpen: float) -> list[tuple[list[int], float]]:
  """The two finished hypotheses (FlipModel) by hand, best first."""
  hyps = [
      ([B, EOS], np.log(0.4 * 0.9) / 2.0**lenpen),
      ([A, B, EOS], np.log(0.6 * 0.3 * 0.9) / 3.0**lenpen),
  ]
  return sorted(hyps, key=lambda h: -h[1])


@pytest.mark.parametrize("lenpen", [0.0, 0.6, 1.0, 2.0])
def test_length_penalty_scores_and_orders_the_nbest(lenpen):
  # lenpen 1: B EOS (-0.511) beats A B EOS (-0.607); lenpen 2 flips them
  # (-0.255 < -0.202): the EOS counts in the length, as in fairseq's
  # SequenceGenerator (eos_scores /= (step + 1) ** len_penalty, step from
  # 0). 0.6 is the authors' IWSLT decoding.
  res = decoding.beam_search(
      FlipModel(),
      {},
      jnp.ones((1, 3), jnp.int32),
      6,
      beam_size=2,
      length_penalty=lenpen,
  )
  want = _flip_nbest(lenpen)
  hyps = np.asarray(res.hypotheses[0])
  for (tokens, score), hyp, got in zip(want, hyps, np.asarray(res.scores[0])):
    np.testing.assert_array_equal(hyp[: len(tokens)], tokens)
    assert not hyp[len(tokens) :].any()
    np.testing.assert_allclose(got, score, atol=1e-5)
  np.testing.assert_array_equal(res.tokens[0], hyps[0])


class FakeVocab:
  """Ids for the table models: every word is token A; decode spells ids."""

  def encode(self, sentence: str) -> list[int]:
    return [A] * len(sentence.split())

  def decode(self, ids) -> str:
    return " ".join({A: "a", B: "b"}[int(i)] for i in ids)


@pytest.mark.parametrize(
    "a, b, tokens",
    # The source "x y z" (3 ids + EOS) is padded to 8 positions; greedy on
    # TableModel takes A until EOS is forced at position int(a * 8 + b).
    [(0.5, 2, 5), (0.0, 3, 2), (0.25, 0, 1), (10.0, 0, 63)],
)
def test_translator_decodes_at_most_a_times_source_plus_b(a, b, tokens):
  from memjax.tasks.translation import translator as translator_lib  # pylint: disable=g-import-not-at-top

  tr = translator_lib.Translator(
      TableModel(), {}, FakeVocab(), beam_size=1, max_len_a=a, max_len_b=b
  )
  # (10, 0): 80 positions, capped at the model's max_len of 64.
  assert tr.translate(["x y z"]) == [" ".join(["a"] * tokens)]


def test_translator_passes_the_config_to_beam_search():
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax import config as config_lib  # pylint: disable=g-import-not-at-top
  from memjax.tasks import config as task_config  # pylint: disable=g-import-not-at-top
  from memjax.tasks.translation import parts  # pylint: disable=g-import-not-at-top

  def translator(config):
    s = build.read(config, build.parts())
    t = s.of(task_config.Translation)
    return parts.make_translator(t, FlipModel(), {}, FakeVocab())

  config = config_lib.base_config()
  t = config.translation
  t.beam_size, t.length_penalty, t.max_len_a, t.max_len_b = 2, 2.0, 0.0, 6
  tr = translator(config)
  got = tr.hypotheses("x y")
  want = [(FakeVocab().decode(h[:-1]), s) for h, s in _flip_nbest(2.0)]
  assert [h for h, _ in got] == [h for h, _ in want] == ["a b", "b"]
  np.testing.assert_allclose(
      [s for _, s in got], [s for _, s in want], atol=1e-5
  )
  # The same search with max_len_b = 2 forces EOS at the second position:
  # A B EOS cannot finish; B EOS and A EOS (0.6 * 0.25) do.
  t.max_len_b = 2
  tr = translator(config)
  got = tr.hypotheses("x y")
  assert [h for h, _ in got] == ["b", "a"]
  np.testing.assert_allclose(
      [s for _, s in got], np.log([0.36, 0.15]) / 4.0, atol=1e-5
  )
