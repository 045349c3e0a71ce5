"""Decoding speed of the encoder-decoder: greedy against beam search.

    python benchmarks/decoding.py [--workdir=runs/demo_mt] \
        [--config=configs/trime_iwslt.py:demo] [--sentences=128] \
        [--beam=4] [--rounds=3] [--steps=1] [--warmup=1] [--out=FILE]

Translates the first ``--sentences`` source sentences of the shipped valid
split with greedy search (the baseline) and beam search (``--beam``, length
penalty 1.0), both jitted and batched as ``--mode=translate`` runs them
(``memjax.translation.Translator``: cached decoder keys and values, sorted
batches of ``translation.decode_batch_size``). With ``--workdir`` the
trained run is restored (its sentences end where the model puts EOS);
without, a freshly initialised model of the config is used (its sentences
mostly run to the length limit, the worst case). The two alternate within
each round (the median round is reported); one step = the whole set of
sentences once. Prints one JSON object with the machine, sentences/s of
both and the ratio; the shared machinery is ``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks import harness  # pylint: disable=g-import-not-at-top


class DecodeBench:
  """Times one decoding method over a fixed set of sentences."""

  def __init__(self, name, translator, sources, beam):
    self.name, self.tr, self.sources, self.beam = (
        name,
        translator,
        sources,
        beam,
    )
    self.times: list[float] = []

  def _once(self) -> None:
    self.tr.translate_ids(self.sources, beam_size=self.beam)

  def warm_up(self, steps: int) -> None:
    for _ in range(steps):
      self._once()

  def run(self, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
      self._once()
    return (time.perf_counter() - start) / steps


def time_benches(benches, args, sentences: int) -> list[dict]:
  """Runs the decoding benches in alternating rounds (``--rounds``,
  ``--steps``, ``--warmup``); one result per bench, in sentences/s."""
  harness.run_rounds(
      benches, rounds=args.rounds, steps=args.steps, warmup=args.warmup
  )
  results = []
  for b in benches:
    s = harness.summarize(b.times, sentences)
    results.append(
        {
            "name": b.name,
            "sentences_per_s": s.get("tokens_per_s"),
            "seconds_per_pass_median": s.get("seconds_per_step_median"),
            "seconds_per_pass_all_rounds": s.get("seconds_per_step_all_rounds"),
        }
    )
  return results


def _model(args, config):
  """(model, params, vocab): the run at --workdir, or a fresh model."""
  # pylint: disable=g-import-not-at-top
  from memjax import build
  from memjax import dispatch
  from memjax.data import parallel
  from memjax.run import step as step_lib

  if args.workdir:
    r = dispatch.restore(args.workdir, config=config)
    return r.model, r.params, r.vocab
  t = config.translation
  cache = tempfile.mkdtemp(prefix="decoding_bench_")
  path = parallel.train_vocabulary(
      parallel.DEFAULT_DIR, t.source_lang, t.target_lang, t.vocab_size, cache
  )
  vocab = parallel.load_vocabulary(path)
  run = build.build(config, cache)
  model = run.model(int(vocab.vocab_size))
  sample = {"inputs": np.zeros((1, 8), np.int32)}
  state, _ = step_lib.create_state(
      model, None, run.mesh, sample, jax.random.PRNGKey(0)
  )
  return model, state.params, vocab


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="configs/trime_iwslt.py:demo")
  parser.add_argument("--workdir", default="", help="a trained run to restore")
  parser.add_argument("--sentences", type=int, default=128)
  parser.add_argument("--beam", type=int, default=4)
  harness.add_timing_args(parser, steps=1, warmup=1, rounds=3)
  args = parser.parse_args()
  config = harness.load_config(args.config, args.set)
  from memjax.data import parallel  # pylint: disable=g-import-not-at-top
  from memjax.tasks.translation import parts  # pylint: disable=g-import-not-at-top

  model, params, vocab = _model(args, config)
  tr = parts.make_translator(config, model, params, vocab)
  t = config.translation
  src, _ = parallel.read_pairs(
      parallel.DEFAULT_DIR, "valid", t.source_lang, t.target_lang
  )
  sources = [tr.encode(s) for s in src[: args.sentences]]
  benches = [
      DecodeBench("greedy", tr, sources, 1),
      DecodeBench(f"beam {args.beam}", tr, sources, args.beam),
  ]
  results = time_benches(benches, args, len(sources))
  harness.finish(
      results,
      args,
      ratio_keys=("sentences_per_s",),
      config=args.config,
      workdir=args.workdir or None,
      sentences=len(sources),
      decode_batch_size=t.decode_batch_size,
  )


if __name__ == "__main__":
  main()
