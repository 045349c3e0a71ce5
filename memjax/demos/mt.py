"""The translation demo: a vanilla encoder-decoder on the shipped German-English
pairs, scored with sacreBLEU.

    python -m memjax.demos.mt --workdir=runs/demo_mt

Trains ``configs/trime_iwslt.py:demo`` (``--mode=train``; resumes if the
workdir holds the run), then prints BLEU (cased, 13a), lowercased BLEU and
chrF on valid for beam 4 and greedy search, next to the copy-the-source
baseline (the German sentence given as the English translation), and scores
test once with beam 4. The table lands in ``<workdir>/table.md`` and
``table.json``.

The trained model must clear a floor on valid: its beam BLEU at least
twice the copy-the-source BLEU (the copy BLEU plus a margin of the copy
BLEU itself; on the shipped valid set 3.22 + 3.22, about four bootstrap
standard deviations of the copy BLEU over 500 sentences, 0.77), and its
chrF above copy's. The demo prints the floor and exits with status 1 and one
line if the model does not clear it.
"""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

_WORKDIR = flags.DEFINE_string("workdir", "runs/demo_mt", "Output directory.")
_STEPS = flags.DEFINE_integer("steps", None, "Override the training steps.")
_VARIANT = flags.DEFINE_string(
    "variant", "demo", "configs/trime_iwslt.py size."
)


class BelowFloorError(RuntimeError):
  """The trained model does not clear the demo's floor."""


def copy_baseline(source_text, target_text) -> dict:
  """sacreBLEU scores of the source sentences given as the translation."""
  from memjax.tasks.translation import bleu  # pylint: disable=g-import-not-at-top

  return bleu.score(list(source_text), list(target_text))


def floor(copy: dict) -> dict:
  """The floor on valid: BLEU of twice the copy BLEU (the copy BLEU plus a
  margin of the copy BLEU), chrF above the copy chrF."""
  return {"bleu": 2.0 * copy["bleu"], "chrf": copy["chrf"]}


def check_floor(model: dict, copy: dict) -> str:
  """Returns a line saying that ``model``'s scores clear the floor of
  ``copy``'s; raises BelowFloorError with one line if they do not."""
  f = floor(copy)
  line = (
      f"floor (valid): BLEU >= {f['bleu']:.2f} (copy {copy['bleu']:.2f} + "
      f"margin {f['bleu'] - copy['bleu']:.2f}) and chrF > {f['chrf']:.2f} "
      f"(copy); model BLEU {model['bleu']:.2f}, chrF {model['chrf']:.2f}"
  )
  if model["bleu"] >= f["bleu"] and model["chrf"] > f["chrf"]:
    return line + ": cleared"
  raise BelowFloorError(line + ": NOT cleared")


def _config(variant: str, steps):
  from configs import trime_iwslt  # pylint: disable=g-import-not-at-top

  c = trime_iwslt.get_config(variant)
  if steps:
    c.train.num_steps = int(steps)
  return c


def run(workdir: str, variant: str = "demo", steps=None) -> dict:
  """Trains (or resumes), scores, and returns the table's rows."""
  from memjax import experiment  # pylint: disable=g-import-not-at-top
  from memjax import train
  from memjax.tasks.translation import bleu
  from memjax.tasks.translation import parts

  config = _config(variant, steps)
  start = time.time()
  trained = train.train_and_evaluate(config, workdir)
  trained["train_seconds"] = time.time() - start  # Valid decoding included.
  restored = experiment.load(workdir, config=config)
  tr = parts.make_translator(
      config, restored.model, restored.params, restored.vocab
  )
  t = config.translation
  valid = parts.read_split(
      config, "valid", os.path.join(workdir, "spm.model"), workdir
  )
  test = parts.read_split(
      config, "test", os.path.join(workdir, "spm.model"), workdir
  )
  rows = {}
  rows["copy the source (baseline)"] = copy_baseline(
      valid.source_text, valid.target_text
  )
  tic = time.time()
  greedy = [tr.vocab.decode(x) for x in tr.translate_ids(valid.source, 1)]
  rows["greedy"] = dict(
      bleu.score(greedy, valid.target_text), seconds=time.time() - tic
  )
  beam = dict(trained["valid"])
  beam["seconds"] = beam.pop("decode_seconds")
  rows[f"beam {t.beam_size}"] = beam
  tic = time.time()
  test_scores = parts.score_split(tr, test, 0, "decoding test")
  test_scores.pop("hypotheses")
  table = {
      "config": config.name,
      "train_steps": trained["step"],
      "train_seconds": trained["train_seconds"],
      "num_params": trained["num_params"],
      "valid": rows,
      "test": {f"beam {t.beam_size}": test_scores},
      "total_seconds": time.time() - start,
      "floor": floor(rows["copy the source (baseline)"]),
  }
  lines = [
      f"| valid ({len(valid.source)} pairs) | BLEU | lowercased BLEU | chrF |",
      "|---|---|---|---|",
  ]
  for name, s in rows.items():
    lines.append(
        f"| {name} | {s['bleu']:.2f} | {s['bleu_lowercase']:.2f} | "
        f"{s['chrf']:.2f} |"
    )
  lines.append(
      f"| test, beam {t.beam_size} (scored once) | {test_scores['bleu']:.2f} | "
      f"{test_scores['bleu_lowercase']:.2f} | {test_scores['chrf']:.2f} |"
  )
  lines.append("")
  lines.append(f"BLEU signature: {test_scores['bleu_signature']}")
  lines.append(f"chrF signature: {test_scores['chrf_signature']}")
  lines.append(
      f"{config.name}: {trained['num_params']:,} parameters, "
      f"{trained['step']} updates in {trained['train_seconds']:.0f} s; "
      f"total {table['total_seconds']:.0f} s"
  )
  try:
    table["floor_line"] = check_floor(
        rows[f"beam {t.beam_size}"], rows["copy the source (baseline)"]
    )
    table["floor_cleared"] = True
  except BelowFloorError as e:
    table["floor_line"], table["floor_cleared"] = str(e), False
  lines.append(table["floor_line"])
  table["markdown"] = "\n".join(lines)
  from memjax import runfiles  # pylint: disable=g-import-not-at-top

  return runfiles.write_table(workdir, table)


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  from memjax import errors  # pylint: disable=g-import-not-at-top

  try:
    table = run(_WORKDIR.value, _VARIANT.value, _STEPS.value)
  except errors.UserError as e:
    print(f"memjax: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(table["markdown"])
  if not table["floor_cleared"]:
    print(f"memjax: error: {table['floor_line']}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
