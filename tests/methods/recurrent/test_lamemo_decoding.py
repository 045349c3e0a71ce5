"""LaMemo's key/value-cache decoding (lamemo_decoding) against recurrent
evaluation: segments of T from the stream's start, the memory refreshed by
look-ahead and carried."""

import numpy as np
import pytest

from memjax.methods.recurrent import lamemo_decoding
from memjax.models import lm_decoding
from memjax.models import sampling as sampling_lib
from memjax.models import transformer
from tests.models import helpers

T = 6


def _model(mem_len, **options):
  cfg = helpers.tiny(
      32,
      num_layers=2,
      attention="lamemo",
      mem_len=mem_len,
      attention_options=options,
  )
  model = transformer.TransformerLM(cfg=cfg)
  x = np.zeros((1, T), np.int32)
  return model, helpers.random_params(model, x, None)


@pytest.mark.parametrize(
    "mem_len, options, lengths",
    [
        (4, {}, (3, 10)),
        (9, {}, (3, 10)),
        (4, {"position": "xl", "interpolate": False}, (3, 10)),
        (4, {}, (13, 20)),
        (9, {}, (12, 12)),
    ],
    ids=[
        "memory-4",
        "memory-9",
        "xl-positions-no-interpolation",
        "memory-4-prefill-2-segments",
        "memory-9-prefill-whole-prompts",
    ],
)
def test_each_step_predicts_as_recurrent_evaluation(mem_len, options, lengths):
  """M = 4 < T and M = 9 > T (the memory reaches over two segments), and
  the paper's switches: two prompts of other lengths (one longer than a
  segment) in a batch, 14 forced tokens each (three segment starts); with
  prompts of two segments or more, their common whole segments
  prefilled."""
  model, variables = _model(mem_len, **options)
  dec = lm_decoding.decoder(model, segment_len=T)
  assert isinstance(dec, lamemo_decoding.LaMemoDecoder)
  rng = np.random.default_rng(3)
  prompts = [rng.integers(0, 32, n) for n in lengths]
  assert dec._prepare(prompts, 1)[0].shape[1] == max(  # pylint: disable=protected-access
      min(lengths) // T * T, 1
  )
  forced = rng.integers(0, 32, (2, 14))
  got = dec.forced_log_probs(variables, prompts, forced)
  for b, prompt in enumerate(prompts):
    seq = np.concatenate([prompt, forced[b]])
    want = helpers.recurrent_log_probs(model, variables, seq, T)
    np.testing.assert_allclose(
        got[b], want[len(prompt) - 1 :], atol=1e-5, rtol=0
    )


def test_a_batch_gives_each_prompt_what_it_gives_alone_and_greedy_argmax():
  model, variables = _model(4)
  dec = lm_decoding.decoder(model, segment_len=T)
  rng = np.random.default_rng(5)
  prompts = [rng.integers(0, 32, n) for n in (3, 10, 7)]
  top_p = sampling_lib.Sampling(top_p=0.9)
  both = dec.generate(variables, prompts, 12, top_p, [1, 2, 3])
  for prompt, seed, row in zip(prompts, [1, 2, 3], both):
    alone = dec.generate(variables, [prompt], 12, top_p, [seed])[0]
    np.testing.assert_array_equal(row, alone)
    assert len(row) == 12
  greedy = sampling_lib.Sampling(greedy=True)
  out = dec.generate(variables, prompts[:1], 10, greedy, [0])[0]
  seq = np.concatenate([prompts[0], out])
  want = helpers.recurrent_log_probs(model, variables, seq, T)
  np.testing.assert_array_equal(out, want[2:-1].argmax(-1))
