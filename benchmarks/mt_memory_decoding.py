"""Beam-search speed with and without the external memory, in one run.

    python benchmarks/mt_memory_decoding.py \
        --workdir=runs/demo_trime_mt/trime_mt \
        [--config=configs/trime_iwslt.py:trime_mt_demo] [--sentences=64] \
        [--beam=4] [--rounds=3] [--steps=1] [--warmup=1] [--out=FILE]

Restores the trained run at ``--workdir`` with its datastore
(``--mode=mt_datastore``) and the settings ``--mode=mt_tune`` chose (else
the config's), and translates the first ``--sentences`` valid sentences
with beam search alone (the baseline) and with the memory of
``mt_memory.kind`` in the hook (host search every step). Both
alternate within each round; the median round is reported. Prints one JSON
object with the machine, sentences/s and the ratio
(``benchmarks/harness.py``).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import harness  # pylint: disable=g-import-not-at-top
from benchmarks.decoding import DecodeBench  # pylint: disable=g-import-not-at-top
from benchmarks.decoding import time_benches  # pylint: disable=g-import-not-at-top


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
      "--config", default="configs/trime_iwslt.py:trime_mt_demo"
  )
  parser.add_argument("--workdir", required=True, help="a trained run")
  parser.add_argument("--sentences", type=int, default=64)
  parser.add_argument("--beam", type=int, default=4)
  harness.add_timing_args(parser, steps=1, warmup=1, rounds=3)
  args = parser.parse_args()
  config = harness.load_config(args.config, args.set)
  # pylint: disable=g-import-not-at-top
  from memjax import dispatch
  from memjax.data import parallel
  from memjax.methods.external import mt_datastore
  from memjax.methods.external import mt_modes as tm
  from memjax.tasks import config as task_config
  from memjax.tasks.translation import parts

  restored = dispatch.restore(args.workdir, config=config)
  s = restored.settings
  kind = config.mt_memory.kind
  store = mt_datastore.open_store(
      restored, mt_datastore.datastore_path(s, args.workdir)
  )
  settings = tm.tuned_settings(s, args.workdir, kind)
  hook = tm.make_hook(s, restored, store, kind, settings)
  t = s.of(task_config.Translation)
  plain = parts.make_translator(
      t, restored.model, restored.params, restored.vocab
  )
  memory = parts.make_translator(
      t, restored.model, restored.params, restored.vocab, hook=hook
  )
  src, _ = parallel.read_pairs(
      parts.data_dir(s.data), "valid", t.source_lang, t.target_lang
  )
  sources = [plain.encode(s) for s in src[: args.sentences]]
  benches = [
      DecodeBench(f"beam {args.beam}", plain, sources, args.beam),
      DecodeBench(
          f"beam {args.beam} + {kind} memory", memory, sources, args.beam
      ),
  ]
  results = time_benches(benches, args, len(sources))
  harness.finish(
      results,
      args,
      ratio_keys=("sentences_per_s",),
      config=args.config,
      workdir=args.workdir,
      sentences=len(sources),
      datastore_keys=store.count,
      memory=dict(settings, kind=kind),
      search=config.mt_memory.search,
      search_seconds=hook.neighbours.seconds,
  )


if __name__ == "__main__":
  main()
