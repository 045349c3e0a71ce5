"""memjax.io.optional: the core runs without TensorFlow, SeqIO, ScaNN and
the [pretrained] extra (safetensors, tokenizers).

The subprocess test makes ``import tensorflow``, ``import seqio`` and
``import scann`` raise (``sys.modules[name] = None``, what Python does for a
package that is not installed). Token caches are prepared beforehand in
this (full) environment; the corpora and the cache are then copied to
another directory (new paths, new modification times), where a decoder LM,
a translation model and a BERT-style encoder train, resume, evaluate,
export and load, the corpora removed after the first two steps: the cache
alone is enough (caches are keyed by the files' content, ``data.content``).
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from memjax import errors
from memjax.io import optional
from tests import conftest
from tests import shared_runs

BLOCKED = (
    "tensorflow",
    "seqio",
    "scann",
    "tensorflow_text",
    "safetensors",
    "tokenizers",
)

# Runs in a fresh interpreter: the packages are made unimportable first.
_SCRIPT = textwrap.dedent("""
    import json, shutil, sys
    for name in %r:
      sys.modules[name] = None
    args = json.loads(sys.argv[1])
    sys.path.insert(0, args["repo"])
    import memjax
    from memjax import api, build, dispatch
    from memjax.modes import evaluation
    from memjax.run import loop
    from tests import shared_runs
    out = {}
    for family, spec in args["runs"].items():
      config = shared_runs.core_config(family, spec["data"])
      config.data.cache_dir = args["cache"]
      workdir = spec["workdir"]
      config.train.checkpoint_every = 2
      def stop(step, state):
        if step == 2:
          raise KeyboardInterrupt  # Interrupted after its step-2 checkpoint,
      try:
        loop.train_and_evaluate(build.build(config, workdir), hooks=(stop,))
      except KeyboardInterrupt:
        pass
      # The corpus removed: the cache alone is read from here on.
      shutil.rmtree(spec["data"])
      res = memjax.train(config, workdir)  # ... it resumes.
      ev = evaluation.evaluate_run(build.build(config, workdir))
      exported = api.export(workdir, workdir + "_export")
      restored = dispatch.restore(exported)
      out[family] = {"step": int(res["step"]), "eval": ev,
                     "num_params": int(res["num_params"]),
                     "vocab": type(restored.vocab).__name__}
      if family == "lm":
        model = memjax.load(exported)
        scored = model.score("the cat sat on the mat")
        out["lm_score"] = [float(x) for x in scored["logprobs"][0]]
    out["modules"] = sorted(
        m for m in sys.modules if m.split(".")[0] in %r and sys.modules[m])
    print("RESULT " + json.dumps(out, default=str))
""") % (BLOCKED, BLOCKED)


def test_require_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "scann", None)
  with pytest.raises(errors.MissingDependencyError) as e:
    optional.require("scann", "a ScaNN datastore index")
  msg = str(e.value)
  assert "\n" not in msg
  assert "a ScaNN datastore index needs scann" in msg
  # memjax is not on PyPI: from a checkout, or from its repository.
  assert "pip install -e '.[retrieval]' in a memjax checkout" in msg
  assert f"'memjax[retrieval] @ git+{optional.repository()}'" in msg


def test_seqio_is_reported_as_the_data_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "seqio", None)
  monkeypatch.setitem(sys.modules, "tensorflow", None)
  with pytest.raises(errors.MissingDependencyError, match=r"memjax\[data\]"):
    optional.require("seqio", "tokenising wikitext103")


def _cache_files(cache: str) -> list[str]:
  """The cache files under ``cache``, without the content/ sidecars."""
  return sorted(
      os.path.relpath(os.path.join(d, n), cache)
      for d, _, names in os.walk(cache)
      for n in names
      if os.path.relpath(d, cache).split(os.sep)[0] != "content"
  )


def _copy_tree(src: str, dest: str) -> None:
  """Copies a folder with new modification times (as another machine's
  copy would have)."""
  shutil.copytree(src, dest, copy_function=shutil.copyfile)
  for d, _, names in os.walk(dest):
    for n in names:
      os.utime(os.path.join(d, n), (1_000_000_000, 1_000_000_000))


def _prepare_caches(tmp_path) -> dict[str, dict[str, str]]:
  """Tokenises the three runs into the shared token cache
  (``conftest.TOKEN_CACHE``, with SeqIO; in the newest environment, which
  has none, the locked one's caches are read there), then copies the
  corpora and the cache to ``<tmp_path>/elsewhere``."""
  from memjax import build  # pylint: disable=g-import-not-at-top

  here, there = tmp_path / "here", tmp_path / "elsewhere"
  here.mkdir()
  runs = {}
  for family in ("lm", "mt", "encoder"):
    data = shared_runs.core_data(family, here)
    config = shared_runs.core_config(family, data)
    config.data.cache_dir = conftest.TOKEN_CACHE
    run = build.build(config, str(here / family))
    run.task.load(run.workdir)  # What --mode=tokenize reads.
    assert not os.path.exists(run.workdir)  # All in data.cache_dir.
    copy = str(there / f"{family}_data")
    _copy_tree(data, copy)
    runs[family] = {"data": copy, "workdir": str(there / family)}
  _copy_tree(conftest.TOKEN_CACHE, str(there / "cache"))
  return runs


@pytest.mark.newest
def test_core_trains_from_a_copied_cache_without_extras_or_corpus(tmp_path):
  runs = _prepare_caches(tmp_path)
  cache = str(tmp_path / "elsewhere" / "cache")
  before = _cache_files(cache)
  env = dict(os.environ, XLA_FLAGS=conftest.xla_flags(1))
  arg = json.dumps({"repo": conftest.REPO, "runs": runs, "cache": cache})
  proc = subprocess.run(
      [sys.executable, "-c", _SCRIPT, arg],
      cwd=str(tmp_path),
      env=env,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
  out = json.loads(line[len("RESULT ") :])
  assert out["modules"] == []  # None of them was imported.
  # The copy hit the cache: nothing was tokenised again.
  assert _cache_files(cache) == before
  assert "memjax.data: tokeniz" not in proc.stdout
  assert "memjax.data: building" not in proc.stdout
  for family in runs:
    assert out[family]["step"] == 4, family
    assert out[family]["num_params"] > 0
    assert not os.path.exists(runs[family]["data"])
  assert out["lm"]["vocab"] == "WordVocabulary"
  assert out["mt"]["vocab"] == "SentencePieceVocabulary"
  assert out["encoder"]["vocab"] == "SentencePieceVocabulary"
  lm_eval = out["lm"]["eval"]["valid"]
  assert np.isfinite(lm_eval["ppl"]) and lm_eval["ppl"] > 1
  # Six words: five scored tokens, each a log-probability.
  assert len(out["lm_score"]) == 5
  assert all(np.isfinite(x) and x < 0 for x in out["lm_score"])
  # Both halves of the resumed run logged their steps.
  with open(os.path.join(runs["lm"]["workdir"], "train_log.jsonl")) as f:
    steps = [json.loads(l)["step"] for l in f if '"step"' in l]
  assert max(steps) == 4


def test_token_caches_in_cloud_storage(tmp_path):
  # Vocabulary and token streams written to, and read from, a URL (fsspec's
  # in-memory filesystem stands in for a bucket).
  import fsspec  # pylint: disable=g-import-not-at-top

  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax.data import corpus as corpus_lib  # pylint: disable=g-import-not-at-top
  from memjax.io import paths  # pylint: disable=g-import-not-at-top

  config = shared_runs.core_config("lm", shared_runs.core_data("lm", tmp_path))
  config.data.cache_dir = "memory://optional_test/cache"
  s = build.build(config, str(tmp_path / "run")).settings
  first = corpus_lib.load_corpus(s.data, s.eval, str(tmp_path / "run"))
  names = sorted(paths.listdir(config.data.cache_dir))
  assert names[0] == "content"  # The SHA-256 sidecars and the records.
  assert [n.split(".")[1] for n in names[1:]] == [
      "test",
      "train",
      "valid",
      "vocab",
  ]
  again = corpus_lib.load_corpus(s.data, s.eval, str(tmp_path / "run2"))
  np.testing.assert_array_equal(first.train.tokens, again.train.tokens)
  assert not os.path.exists(str(tmp_path / "run"))  # Nothing local.
  fsspec.filesystem("memory").rm("/optional_test", recursive=True)


def test_the_repository_comes_from_the_installed_metadata(monkeypatch):
  import email.message  # pylint: disable=g-import-not-at-top
  import importlib.metadata  # pylint: disable=g-import-not-at-top

  def metadata(**fields):
    meta = email.message.Message()
    for key, values in fields.items():
      for v in values:
        meta[key.replace("_", "-")] = v
    return lambda name: meta

  monkeypatch.setattr(
      importlib.metadata,
      "metadata",
      metadata(Project_URL=["Source, https://github.com/me/memjax"]),
  )
  assert optional.repository() == "https://github.com/me/memjax"
  assert "'memjax[data] @ git+https://github.com/me/memjax'" in (
      optional.install_hint("data")
  )
  monkeypatch.setattr(importlib.metadata, "metadata", metadata())
  assert optional.repository() == "https://github.com/<owner>/memjax"
