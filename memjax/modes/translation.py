"""``--mode=translate``: a run's beam translations of a file or a split,
scored with sacreBLEU when the split has references. (Translation configs
train with ``--mode=train``, through ``memjax.tasks.translation.task``.)"""

from __future__ import annotations

from typing import Any

from memjax import errors
from memjax.checkpoints import runfiles
from memjax.data import parallel
from memjax.io import console
from memjax.io import paths
from memjax.run import restore
from memjax.run import spec
from memjax.tasks import config as task_config
from memjax.tasks.translation import bleu
from memjax.tasks.translation import parts


def translate(run: spec.Run) -> dict[str, Any]:
  """``--mode=translate``: translates ``translation.input_file`` (one
  sentence per line), or the split ``translation.split`` and scores it.

  Writes ``translation.output_file`` (default
  ``<workdir>/translations/<split or file name>.beam<K>.txt``) and, for a
  split, ``<workdir>/translate_<split>.json``.
  """
  t = run.settings.of(task_config.Translation)
  workdir = run.workdir
  source = run.source()
  if t.vocab_file:
    parts.check_vocabulary(paths.resolve(t.vocab_file), source)
  if t.input_file:
    if not paths.isfile(t.input_file):
      raise errors.DataError(f"translation.input_file {t.input_file} not found")
    with paths.open(t.input_file, encoding="utf-8") as f:
      sentences = f.read().splitlines()
    name, refs = paths.basename(t.input_file), None
  else:
    src, ref = parallel.read_pairs(
        parts.data_dir(run.settings.data),
        t.split,
        t.source_lang,
        t.target_lang,
    )
    sentences, name, refs = src, t.split, ref
  restored = restore.restore(run, runfiles.find(paths.resolve(source)))
  tr = parts.make_translator(
      t, restored.model, restored.variables, restored.vocab
  )
  hyps = tr.translate(sentences, desc=f"translating {name}")
  out = t.output_file or paths.join(
      workdir, "translations", f"{name}.beam{t.beam_size}.txt"
  )
  paths.makedirs(paths.dirname(paths.resolve(out)))
  with paths.open(out, "w", encoding="utf-8") as f:
    f.write("\n".join(hyps) + "\n")
  console.info("wrote %d translations to %s", len(hyps), out)
  results: dict[str, Any] = {"output_file": out, "sentences": len(hyps)}
  lines = [f"translations: {out}"]
  if refs is not None:
    scores = bleu.score(hyps, refs)
    results[name] = scores
    lines.append(bleu.summary(scores, name))
    path = paths.join(workdir, f"translate_{name}.json")
    paths.write_json(path, results)
    results["results_path"] = path
  results["summary_lines"] = lines
  return results
