"""The suite's shared trained runs, one per family, and the cut-down
configs they and other tests build (a pytest plugin of ``conftest.py``).

A run is trained once per test run, under a file lock however many test
processes ask for it (``_once``); tests that only read a run share it, tests
that resume, damage or extend one work on a copy.
"""

import fcntl
import os

import pytest

from tests.conftest import REPO
from tests.conftest import run_main


@pytest.fixture(scope="session")
def smoke_workdir(tmp_path_factory):
  """One finished smoke run (configs/trime_wt103.py:smoke) shared by the
  tests that only read it (loading, scoring, export, notebooks)."""
  return _shared_run(
      tmp_path_factory, "shared_smoke", "--config=configs/trime_wt103.py:smoke"
  )


@pytest.fixture(scope="session")
def resm_smoke_workdir(tmp_path_factory):
  """A short residual-memory smoke run (configs/pkm_wt103.py:resm_smoke)
  with two checkpoints, shared by the product-key memory tests and
  notebook."""
  return _shared_run(
      tmp_path_factory,
      "resm_smoke",
      "--config=configs/pkm_wt103.py:resm_smoke",
      "--config.train.num_steps=4",
      "--config.train.checkpoint_every=2",
      "--config.train.log_every=2",
      "--config.train.eval_every=0",
      "--config.eval.max_windows=16",
  )


@pytest.fixture(scope="session")
def marge_smoke_workdir(tmp_path_factory):
  """An 8-step modified-MARGE smoke run (configs/marge_wt103.py:smoke, the
  index rebuilt at steps 4 and 8), shared by the MARGE notebook."""
  return _shared_run(
      tmp_path_factory, "marge_smoke", "--config=configs/marge_wt103.py:smoke"
  )


# The shared translation smoke run's settings over configs/trime_iwslt.py:smoke.
MT_SMOKE_SETTINGS = {
    "train.num_steps": 4,
    "translation.eval_max_sentences": 16,
    "translation.decode_batch_size": 16,
    "translation.buckets": (32,),
}


@pytest.fixture(scope="session")
def mt_smoke_config():
  """A function (data_dir, **translation overrides) -> the config of the
  shared translation smoke run (``mt_smoke_workdir``), for in-process runs
  and checks against it."""

  def make(data_dir, **translation_overrides):
    from configs import trime_iwslt  # pylint: disable=g-import-not-at-top

    c = trime_iwslt.get_config("smoke")
    c.data.data_dir = str(data_dir)
    for key, value in MT_SMOKE_SETTINGS.items():
      section, name = key.split(".")
      c[section][name] = value
    for k, v in translation_overrides.items():
      c.translation[k] = v
    return c

  return make


def mt_subset(root) -> str:
  """``<root>/mt_data``: the first 300 shipped pairs of each split."""
  import pathlib  # pylint: disable=g-import-not-at-top

  data = pathlib.Path(root) / "mt_data"
  data.mkdir(exist_ok=True)
  for split in ("train", "valid", "test"):
    for lang in ("de", "en"):
      src = os.path.join(REPO, "demo_data", "mt_de_en", f"{split}.{lang}")
      with open(src, encoding="utf-8") as f:
        lines = f.read().splitlines()[:300]
      (data / f"{split}.{lang}").write_text(
          "\n".join(lines) + "\n", encoding="utf-8"
      )
  return str(data)


@pytest.fixture(scope="session")
def mt_smoke_workdir(tmp_path_factory):
  """A 4-step translation smoke run (configs/trime_iwslt.py:smoke) on the
  first 300 shipped pairs of each split (the data in ``<run>/../mt_data``),
  shared by the translation tests and notebook."""

  def subset(root):
    flags = [f"--config.{k}={v}" for k, v in MT_SMOKE_SETTINGS.items()]
    return (f"--config.data.data_dir={mt_subset(root)}", *flags)

  return _shared_run(
      tmp_path_factory,
      "mt_smoke",
      "--config=configs/trime_iwslt.py:smoke",
      prepare=subset,
  )


def _shared_run(tmp_path_factory, name: str, *args: str, prepare=None) -> str:
  """Trains ``memjax.main *args`` once per test run into ``<tmp>/<name>``
  (what it printed in ``<tmp>/<name>.stdout``).

  ``prepare(root)``, if given, writes what the run needs into ``root`` and
  returns more flags. See ``_once`` for how workers share the run.
  """

  def train(root, workdir):
    extra = tuple(prepare(root)) if prepare else ()
    proc = run_main(*args, *extra, f"--workdir={workdir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(f"{workdir}.stdout", "w") as f:
      f.write(proc.stdout)

  return _once(tmp_path_factory, name, train)


def shared_stdout(workdir: str) -> str:
  """What ``memjax.main`` printed while training a shared run."""
  with open(f"{workdir}.stdout") as f:
    return f.read()


def _once(tmp_path_factory, name: str, make) -> str:
  """Runs ``make(root, workdir)`` once per test run; returns ``workdir``.

  ``workdir`` is ``<root>/<name>``. Under pytest-xdist each worker has its
  own session: the first worker to get here makes the run under a file lock
  in the directory all workers share, and the others wait for it and reuse
  it.
  """
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent
  workdir = root / name
  done = root / f"{name}.done"
  with open(root / f"{name}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      make(root, workdir)
      done.touch()
  return str(workdir)


# -- recurrent memory (configs/lamemo_wt103.py) -------------------------------


# The recurrent smoke runs' settings over configs/<name>.py:smoke: 6 steps of
# two micro-batches of 8 lanes, logged and evaluated at steps 3 and 6.
RECURRENT_SMOKE_SETTINGS = {
    "train.num_steps": 6,
    "train.log_every": 3,
    "train.eval_every": 3,
    "train.eval_max_windows": 2,
    "train.checkpoint_every": 6,
    "data.batch_size": 16,
    "train.grad_accum": 2,  # Sums add up over micro-batches.
    "eval.max_windows": 4,
}


def recurrent_smoke_config(name: str, cache_dir: str):
  """``configs/<name>.py:smoke`` (txl_wt103, lamemo_wt103) with
  ``RECURRENT_SMOKE_SETTINGS``, its token caches in ``cache_dir``."""
  import importlib  # pylint: disable=g-import-not-at-top

  c = importlib.import_module(f"configs.{name}").get_config("smoke")
  c.data.cache_dir = cache_dir
  for key, value in RECURRENT_SMOKE_SETTINGS.items():
    section, field = key.split(".")
    c[section][field] = value
  return c


def recurrent_smoke_flags(name: str, cache_dir: str) -> tuple[str, ...]:
  """The command line of ``recurrent_smoke_config(name, cache_dir)``."""
  return (
      f"--config=configs/{name}.py:smoke",
      f"--config.data.cache_dir={cache_dir}",
      *[f"--config.{k}={v}" for k, v in RECURRENT_SMOKE_SETTINGS.items()],
  )


def lamemo_smoke_cache(workdir: str) -> str:
  """The token caches of the shared LaMemo run ``workdir``."""
  return os.path.join(os.path.dirname(workdir), "lamemo_smoke_cache")


@pytest.fixture(scope="session")
def lamemo_smoke_workdir(tmp_path_factory):
  """The LaMemo smoke run (``recurrent_smoke_config``) trained by memjax.main,
  shared by the statistics and recurrent-mode tests, the mode matrix and
  the notebook."""
  return _shared_run(
      tmp_path_factory,
      "lamemo_smoke",
      prepare=lambda root: recurrent_smoke_flags(
          "lamemo_wt103", lamemo_smoke_cache(str(root / "lamemo_smoke"))
      ),
  )


# -- BERT-style encoders (configs/pkm_bert.py) ---------------------------------

BERT_VOCAB = 300  # Sentencepiece pieces of the tiny MLM corpus.


def bert_smoke_config(variant: str, corpus_dir: str):
  """``configs/pkm_bert.py:<variant>`` on the tiny MLM corpus, cut down."""
  from configs import pkm_bert  # pylint: disable=g-import-not-at-top

  c = pkm_bert.get_config(variant)
  c.mlm.data_dir = corpus_dir
  c.mlm.vocab_size = BERT_VOCAB
  c.train.num_steps = 2
  c.eval.max_windows = 16
  c.eval.splits = ("valid",)
  return c


def _tiny_wiki(root) -> str:
  """The demo WikiText cut to a few hundred lines (fast vocabulary)."""
  from memjax.data import mlm  # pylint: disable=g-import-not-at-top

  d = root / "bert_tiny_wiki"
  d.mkdir(exist_ok=True)
  for split, n in (("train", 600), ("valid", 120), ("test", 120)):
    with open(os.path.join(mlm.DEFAULT_DIR, f"wiki.{split}.tokens")) as f:
      lines = f.read().splitlines()[:n]
    (d / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n")
  return str(d)


@pytest.fixture(scope="session")
def bert_mlm_smoke_workdir(tmp_path_factory):
  """A 2-step memory-less MLM run (configs/pkm_bert.py:smoke) on the
  tiny corpus in ``<run>/../bert_tiny_wiki``, trained in process (it
  shares compiled programs with the tests beside it)."""

  def make(root, workdir):
    import memjax  # pylint: disable=g-import-not-at-top

    config = bert_smoke_config("smoke", _tiny_wiki(root))
    memjax.train(config, str(workdir))

  return _once(tmp_path_factory, "bert_mlm_smoke", make)


@pytest.fixture(scope="session")
def bert_cls_smoke_workdir(tmp_path_factory, bert_mlm_smoke_workdir):
  """A 2-step ResM fine-tune (configs/pkm_bert.py:cls_resm_smoke) of the
  MLM run on the shipped sentiment set, dev accuracy at both steps; shared
  by the fine-tuning test and the notebook."""

  def make(root, workdir):
    import memjax  # pylint: disable=g-import-not-at-top

    config = bert_smoke_config("cls_resm_smoke", str(root / "bert_tiny_wiki"))
    config.train.init_from = bert_mlm_smoke_workdir
    config.train.eval_every = 1
    memjax.train(config, str(workdir))

  return _once(tmp_path_factory, "bert_cls_smoke", make)


# -- evaluation memories ------------------------------------------------------


@pytest.fixture(scope="session")
def repetitive_setup():
  """A function (model, window) -> (model, params, tokens [49], one-device
  mesh) for a stream in which a 7-token phrase recurs, so that long-term
  and external memories hold positives."""
  return _repetitive_setup


def _repetitive_setup(model, window: int):
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from memjax import sharding as sharding_lib  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  phrase = rng.integers(3, 24, 7)
  tokens = np.concatenate(
      [phrase if i % 2 else rng.integers(3, 24, 7) for i in range(7)]
  ).astype(np.int32)
  # The premise of every test that uses it: the phrase recurs (at positions
  # 7, 21, 35), so a memory of earlier windows holds its continuations.
  starts = [
      i for i in range(len(tokens) - 6) if (tokens[i : i + 7] == phrase).all()
  ]
  assert starts[:3] == [7, 21, 35] and window < len(tokens), (starts, window)
  params = model.init(
      jax.random.PRNGKey(0), tokens[None, :window], tokens[None, 1 : window + 1]
  )["params"]
  one = sharding_lib.make_mesh({"data": 1}, jax.devices()[:1])
  return model, params, tokens, one


# -- the core without the optional packages (tests/io/test_optional.py) ----------


def core_data(family: str, root) -> str:
  """The data directory of a cut-down run of ``family`` ('lm', 'mt' or
  'encoder'), made under ``root`` where it is a subset."""
  import pathlib  # pylint: disable=g-import-not-at-top

  root = pathlib.Path(root)
  if family == "lm":
    return os.path.join(REPO, "demo_data", "wikitext")
  if family == "encoder":
    return _tiny_wiki(root)
  return mt_subset(root)


def core_config(family: str, data_dir: str):
  """The smoke config of ``family`` on ``data_dir``, 4 steps, small eval."""
  if family == "encoder":
    c = bert_smoke_config("smoke", data_dir)
    c.train.num_steps = 4
    return c
  if family == "mt":
    from configs import trime_iwslt  # pylint: disable=g-import-not-at-top

    c = trime_iwslt.get_config("smoke")
    for key, value in MT_SMOKE_SETTINGS.items():
      section, name = key.split(".")
      c[section][name] = value
  else:
    from configs import trime_wt103  # pylint: disable=g-import-not-at-top

    c = trime_wt103.get_config("smoke")
    c.eval.max_windows = 8
  c.data.data_dir = data_dir
  c.train.num_steps = 4
  return c


@pytest.fixture(scope="session")
def imported_gpt2(tmp_path_factory):
  """The tiny GPT-2 fixture imported (``--mode=import``, in process) into a
  workdir the tests that only read it share; copy it to write into it."""
  from configs import pretrained  # pylint: disable=g-import-not-at-top
  import memjax  # pylint: disable=g-import-not-at-top

  c = pretrained.get_config("import")
  c.pretrained.path = os.path.join(
      REPO, "tests", "fixtures", "pretrained", "gpt2"
  )
  workdir = str(tmp_path_factory.mktemp("imported_gpt2") / "gpt2")
  memjax.run_mode("import", c, workdir)
  return workdir
