"""The translation demo: a vanilla encoder-decoder on the shipped German-English
pairs, scored with sacreBLEU.

    python -m memjax.demos.mt --workdir=runs/demo_mt

Trains ``configs/trime_iwslt.py:demo`` (``--mode=train``; resumes an
interrupted run in the workdir, reads back a finished one), then prints
BLEU (cased, 13a), lowercased BLEU and chrF on valid for beam 4 and greedy
search, next to the copy-the-source baseline (the German sentence given as
the English translation), and scores test once with beam 4. The table lands
in ``<workdir>/table.md`` and ``table.json``.

The trained model must clear a floor on valid: its beam BLEU at least
twice the copy-the-source BLEU (the copy BLEU plus a margin of the copy
BLEU itself; on the shipped valid set 3.22 + 3.22, about four bootstrap
standard deviations of the copy BLEU over 500 sentences, 0.77), and its
chrF above copy's. The demo prints the floor and exits with status 1 and one
line if the model does not clear it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from absl import flags

from memjax.io import paths
from memjax.demos import common

FLAGS = common.define_flags(
    "runs/demo_mt", steps="Override the training steps."
)
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


def _scores(config: Any, workdir: str, trained: dict) -> tuple[dict, dict, int]:
  """The valid rows (copy, greedy, beam), the test scores (beam) and the
  number of valid pairs."""
  # pylint: disable=g-import-not-at-top
  from memjax import dispatch
  from memjax.tasks import config as task_config
  from memjax.tasks.translation import bleu
  from memjax.tasks.translation import parts

  restored = dispatch.restore(workdir, config=config)
  s = restored.settings
  tr = parts.make_translator(
      s.of(task_config.Translation),
      restored.model,
      restored.variables,
      restored.vocab,
  )
  spm = paths.join(workdir, "spm.model")
  valid = parts.read_split(s, "valid", spm, workdir)
  test = parts.read_split(s, "test", spm, workdir)
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
  rows[f"beam {config.translation.beam_size}"] = beam
  test_scores = parts.score_split(tr, test, 0, "decoding test")
  test_scores.pop("hypotheses")
  return rows, test_scores, len(valid.source)


def _markdown(table: dict[str, Any], pairs: int) -> str:
  """The table: valid rows, test once, the signatures, sizes and time."""
  ((test_name, test),) = table["test"].items()
  body = [
      [name, *(f"{s[k]:.2f}" for k in ("bleu", "bleu_lowercase", "chrf"))]
      for name, s in {
          **table["valid"],
          f"test, {test_name} (scored once)": test,
      }.items()
  ]
  lines = [
      common.markdown(
          [f"valid ({pairs} pairs)", "BLEU", "lowercased BLEU", "chrF"],
          "llll",
          body,
      ),
      "",
      f"BLEU signature: {test['bleu_signature']}",
      f"chrF signature: {test['chrf_signature']}",
      f"{table['config']}: {table['num_params']:,} parameters, "
      f"{table['train_steps']} updates in {table['train_seconds']:.0f} s; "
      f"total {table['total_seconds']:.0f} s",
      table["floor_line"],
  ]
  return "\n".join(lines)


def run(workdir: str, variant: str = "demo", steps: int | None = None) -> dict:
  """Trains (or resumes, or reads back), scores, writes and prints the
  table; returns what ``table.json`` holds."""
  demo = common.Demo(workdir)
  config = common.load_config("trime_iwslt", variant)
  if steps:
    config.train.num_steps = int(steps)
  trained = common.train(config, workdir)
  trained["train_seconds"] = time.time() - demo.start  # Valid decoding too.
  rows, test, pairs = _scores(config, workdir, trained)
  beam = f"beam {config.translation.beam_size}"
  table = {
      "config": config.name,
      "train_steps": trained["step"],
      "train_seconds": trained["train_seconds"],
      "num_params": trained["num_params"],
      "valid": rows,
      "test": {beam: test},
      "total_seconds": time.time() - demo.start,
      "floor": floor(rows["copy the source (baseline)"]),
  }
  try:
    table["floor_line"] = check_floor(
        rows[beam], rows["copy the source (baseline)"]
    )
    table["floor_cleared"] = True
  except BelowFloorError as e:
    table["floor_line"], table["floor_cleared"] = str(e), False
  return demo.finish(table, _markdown(table, pairs))


def main() -> None:
  table = run(FLAGS.workdir.value, _VARIANT.value, FLAGS.steps.value)
  if not table["floor_cleared"]:
    print(f"memjax: error: {table['floor_line']}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  common.run(main)
