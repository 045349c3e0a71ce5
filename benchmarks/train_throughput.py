"""Training throughput and step memory of one or more configs, in one run.

    python benchmarks/train_throughput.py \
        --config=configs/trime_wt103.py:demo [--config=OTHER ...] \
        [--steps=10] [--warmup=1] [--rounds=3] \
        [--set=model.dtype=bfloat16 ...] [--out=FILE]

Each config trains on its own corpus (the demo copy unless
``data.data_dir`` is set). The first config is the baseline: every config
is reported with its tokens/s, seconds per step and step memory as ratios
against it. ``--set`` overrides apply to every config and are parsed like
``--config.KEY=VALUE`` of ``memjax.main`` (``model.remat=False`` is False;
an unknown key is an error). TRIME configs are timed with the plain-LM
warm-up off (``trime.lm_warmup_fraction = 0``), so every timed step computes
the TRIME loss.

Step memory is XLA's compiled memory analysis of the train step (arguments
+ outputs + temporaries - donated aliases), the same on every backend; the
device's peak bytes in use (GPU, TPU) and the process's peak resident set
are reported once for the whole run. Configs alternate within each round
and the median round is reported, so changes in machine load during the run
affect every config alike. Prints one JSON object with the machine it ran
on; the shared machinery is ``benchmarks/harness.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import harness  # pylint: disable=g-import-not-at-top

RATIO_KEYS = ("tokens_per_s", "seconds_per_step_median", "step_memory_bytes")


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument(
      "--config",
      action="append",
      required=True,
      help="path.py[:variant]; repeat to compare, the first is the baseline",
  )
  harness.add_timing_args(p, steps=10, warmup=1, rounds=3)
  args = p.parse_args(argv)
  try:
    cfgs = [harness.load_config(spec, args.set) for spec in args.config]
  except harness.ConfigError as e:
    p.error(str(e))
  benches = []
  with tempfile.TemporaryDirectory() as tmp:
    for spec, cfg in zip(args.config, cfgs):
      harness.log(f"building {spec} ...")
      batcher, vocab_size = harness.load_corpus(cfg, tmp)
      batches = harness.host_batches(batcher, max(args.steps, 1))
      benches.append(harness.TrainBench(spec, cfg, vocab_size, batches))
  harness.run_rounds(
      benches, rounds=args.rounds, steps=args.steps, warmup=args.warmup
  )
  harness.finish([b.result() for b in benches], args, ratio_keys=RATIO_KEYS)
  return 0


if __name__ == "__main__":
  sys.exit(main())
