"""The mode matrix: every registered mode, on each run kind it declares,
through ``python -m memjax.main`` as a user runs it.

Each cell copies one of the suite's shared smoke runs (so the runs are
trained once, and a mode that writes into its workdir changes no other
test's run), runs the mode, and checks that it exits 0 and that every file
the mode declares (``extend.Mode.outputs``) was written by it and reads
back. A mode given a kind it does not take is one line and exit 2, with
nothing written; that holds for a method added from outside memjax too.

Run the matrix alone with ``pytest -m matrix tests/test_mode_matrix.py``.
"""

import csv
import glob
import json
import os
import shutil
import time

import numpy as np
import pytest

from memjax import build

from memjax import dispatch
from memjax import extend
from tests import shared_runs
from tests.conftest import REPO
from tests.conftest import run_main

pytestmark = pytest.mark.matrix

# The shared runs the cells copy: the fixture that trains it, its kind, and
# the config flags that rebuild its config on the command line (the cells
# that set a mode's own keys pass them with these).
RUNS = {
    "lm": (
        "smoke_workdir",
        "lm/decoder_lm",
        ("--config=configs/trime_wt103.py:smoke",),
    ),
    "resm": (
        "resm_smoke_workdir",
        "lm/decoder_lm",
        ("--config=configs/pkm_wt103.py:resm_smoke",),
    ),
    "recurrent": ("lamemo_smoke_workdir", "lm/decoder_lm", ()),
    "marge": ("marge_smoke_workdir", "lm/marge", ()),
    "mt": ("mt_smoke_workdir", "translation/encoder_decoder", ()),
    "mlm": ("bert_mlm_smoke_workdir", "mlm/encoder", ()),
    "cls": ("bert_cls_smoke_workdir", "classification/encoder", ()),
}
# A run of each kind in extend.RUN_KINDS, for the modes that take any run.
ANY_RUN = {
    "lm": "lm",
    "translation": "mt",
    "mlm": "mlm",
    "classification": "cls",
}

# A mode's own settings that keep a cell short (the flags go after the
# run's own config flags, so those cells name the config).
MODE_FLAGS = {
    "extrapolate": (
        "--config.extrapolate.ratios=(1, 2)",
        "--config.extrapolate.max_segments=2",
    ),
    "datastore": ("--config.datastore.max_windows=8",),
    # A datastore of 8 windows holds fewer keys than the default K.
    "index": ("--config.eval_memory.ext_k=32",),
    "recall": (
        "--config.datastore.recall_queries=50",
        "--config.eval_memory.ext_k=32",
    ),
    # The smoke run batches at random; pack writes what BM25 batching reads.
    "pack": ("--config.data.batching=bm25",),
}

# Cells: (mode, run). Chains run in order in one copy: the later modes
# read what the earlier ones wrote.
SINGLE = [
    *[
        (m, ANY_RUN[k])
        for m in ("eval", "export", "tokenize", "plan", "train")
        for k in extend.RUN_KINDS
        if build.parts().modes.get(m).takes(RUNS[ANY_RUN[k]][1])
    ],
    *[
        (m, "lm")
        for m in (
            "generate",
            "memeval",
            "tune",
            "memsweep",
            "buckets",
            "position_loss",
            "pack",
        )
    ],
    ("memory_usage", "resm"),
    ("analyze", "recurrent"),
    ("extrapolate", "recurrent"),
    ("marge_eval", "marge"),
    ("translate", "mt"),
    ("import", "lm"),
]
# Cells that start their own ``python -m memjax.main``, as a user does; the
# others run in the test process's long-lived one (``conftest.run_main``),
# and every --mode=plan cell starts its own (it sets the device count).
FRESH = {("eval", "lm"), ("train", "cls"), ("tokenize", "mt")}
CHAINS = {
    "lm_datastore": (("datastore", "index", "recall"), "lm"),
    "mt_datastore": (("mt_datastore", "mt_tune", "mt_translate"), "mt"),
}


def _bert_flags(run: str, source: str) -> tuple[str, ...]:
  """The flags of ``shared_runs.bert_smoke_config`` (and the fine-tune's)."""
  root = os.path.dirname(source)
  variant = "smoke" if run == "mlm" else "cls_resm_smoke"
  flags = (
      f"--config=configs/pkm_bert.py:{variant}",
      f"--config.mlm.data_dir={os.path.join(root, 'bert_tiny_wiki')}",
      f"--config.mlm.vocab_size={shared_runs.BERT_VOCAB}",
      "--config.eval.max_windows=16",
      "--config.eval.splits=('valid',)",
  )
  if run == "cls":
    flags += (
        f"--config.train.init_from={os.path.join(root, 'bert_mlm_smoke')}",
        "--config.train.eval_every=1",
    )
  return flags


def _config_flags(run: str, source: str) -> tuple[str, ...]:
  """Flags that rebuild the config ``source`` was trained with."""
  if run == "recurrent":
    return shared_runs.recurrent_smoke_flags(
        "lamemo_wt103", shared_runs.lamemo_smoke_cache(source)
    )
  if run in ("mlm", "cls"):
    return _bert_flags(run, source)
  if run == "mt":
    settings = shared_runs.MT_SMOKE_SETTINGS
    data = os.path.join(os.path.dirname(source), "mt_data")
    return (
        "--config=configs/trime_iwslt.py:smoke",
        f"--config.data.data_dir={data}",
        *[f"--config.{k}={v}" for k, v in settings.items()],
    )
  if run == "resm":
    return (
        *RUNS["resm"][2],
        "--config.train.checkpoint_every=2",
        "--config.train.log_every=2",
        "--config.train.eval_every=0",
        "--config.eval.max_windows=16",
    )
  if run == "marge":
    return ("--config=configs/marge_wt103.py:smoke",)
  return RUNS[run][2]


def _copy(request, run: str, tmp_path) -> tuple[str, str]:
  """(a copy of the shared run ``run`` in ``tmp_path``, the original)."""
  source = request.getfixturevalue(RUNS[run][0])
  workdir = str(tmp_path / "run")
  shutil.copytree(source, workdir)
  return workdir, source


def _run_mode(mode: str, run: str, workdir: str, source: str, tmp_path):
  """Runs ``--mode=mode`` on ``workdir``; returns the process."""
  args = [f"--mode={mode}", f"--workdir={workdir}"]
  if mode == "train":  # One more step, resumed from the copied checkpoint.
    with open(os.path.join(workdir, "config.json")) as f:
      steps = json.load(f)["train"]["num_steps"]
    args += [
        *_config_flags(run, source),
        f"--config.train.num_steps={steps + 1}",
        "--config.train.extend_schedule=True",
    ]
  elif mode == "translate":  # Eight sentences of a file, not a whole split.
    src = os.path.join(os.path.dirname(source), "mt_data", "test.de")
    with open(src, encoding="utf-8") as f:
      lines = f.read().splitlines()[:8]
    short = tmp_path / "eight.de"
    short.write_text("\n".join(lines) + "\n", encoding="utf-8")
    args += [
        *_config_flags(run, source),
        f"--config.translation.input_file={short}",
    ]
  elif mode in MODE_FLAGS:
    args += [*_config_flags(run, source), *MODE_FLAGS[mode]]
  return run_main(*args, fresh=(mode, run) in FRESH)


def _read_back(path: str) -> None:
  """Reads ``path`` as its extension says; fails on an empty or broken one."""
  assert os.path.getsize(path) > 0, f"{path} is empty"
  ext = os.path.splitext(path)[1]
  if ext == ".json":
    with open(path) as f:
      json.load(f)
  elif ext == ".jsonl":
    with open(path) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    assert rows, path
  elif ext == ".csv":
    with open(path, newline="") as f:
      assert len(list(csv.reader(f))) >= 2, path  # A header and a row.
  elif ext in (".md", ".txt"):
    with open(path, encoding="utf-8") as f:
      assert f.read().strip(), path
  elif ext == ".png":
    with open(path, "rb") as f:
      assert f.read(8) == b"\x89PNG\r\n\x1a\n", path
  elif ext in (".npy", ".npz"):
    np.load(path)


def _check_outputs(mode: str, workdir: str, started: float) -> None:
  """Each declared pattern matches a file this mode wrote, read back."""
  spec = build.parts().modes.get(mode)
  assert spec.outputs, f"--mode={mode} declares no outputs"
  for pattern in spec.outputs:
    found = glob.glob(os.path.join(workdir, pattern))
    assert found, f"--mode={mode} wrote nothing matching {pattern}"
    if not (spec.training and pattern == "config.json"):  # Kept on resume.
      newest = max(os.path.getmtime(p) for p in found)
      assert newest >= started, f"--mode={mode}: {pattern} is not new"
    for path in found:
      if os.path.isfile(path):
        _read_back(path)


def _import(tmp_path):
  """--mode=import of the tiny GPT-2 fixture into a new workdir: the one
  mode that starts from a Hugging Face folder, not from a run."""
  workdir = str(tmp_path / "imported")
  started = time.time() - 1
  proc = run_main(
      "--config=configs/pretrained.py:import",
      "--config.pretrained.path="
      + os.path.join(REPO, "tests", "fixtures", "pretrained", "gpt2"),
      f"--workdir={workdir}",
      "--mode=import",
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  _check_outputs("import", workdir, started)
  return workdir, proc


def _cell(request, mode, run, tmp_path):
  if mode == "import":
    return _import(tmp_path)
  workdir, source = _copy(request, run, tmp_path)
  if mode == "tokenize":  # It must write the caches, not find them.
    shutil.rmtree(os.path.join(workdir, "cache"), ignore_errors=True)
  started = time.time() - 1
  proc = _run_mode(mode, run, workdir, source, tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  _check_outputs(mode, workdir, started)
  return workdir, proc


@pytest.mark.parametrize(
    "mode,run", SINGLE, ids=[f"{m}-{r}" for m, r in SINGLE]
)
def test_the_mode_runs_on_its_kind_and_writes_what_it_declares(
    request, mode, run, tmp_path
):
  workdir, proc = _cell(request, mode, run, tmp_path)
  if mode == "train":  # The new checkpoint restores, one step on.
    with open(os.path.join(workdir, "config.json")) as f:
      steps = json.load(f)["train"]["num_steps"]
    assert dispatch.restore(workdir).step == steps
  elif mode == "export":  # The export restores on its own; said once.
    assert proc.stdout.count("exported step") == 1, proc.stdout
    assert dispatch.restore(os.path.join(workdir, "export")).params


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_the_modes_that_build_on_each_other_run_in_turn(
    request, chain, tmp_path
):
  modes, run = CHAINS[chain]
  workdir, source = _copy(request, run, tmp_path)
  for mode in modes:
    started = time.time() - 1
    proc = _run_mode(mode, run, workdir, source, tmp_path)
    assert proc.returncode == 0, f"--mode={mode}: {proc.stderr[-3000:]}"
    _check_outputs(mode, workdir, started)


def test_the_matrix_covers_every_mode_on_every_kind_it_declares():
  cells = {(m, RUNS[r][1]) for m, r in SINGLE}
  for modes, run in CHAINS.values():
    cells |= {(m, RUNS[run][1]) for m in modes}
  covered = {}
  for mode, kind in cells:
    covered.setdefault(mode, set()).add(kind)
  for name in build.parts().modes.names():
    spec = build.parts().modes.get(name)
    assert name in covered, f"--mode={name} is not in the matrix"
    wanted = spec.kinds or tuple(extend.RUN_KINDS)
    for kind in wanted:
      assert any(
          k == kind or k.partition("/")[0] == kind for k in covered[name]
      ), f"--mode={name} is not run on a {kind} run"


# -- a mode given a kind it does not take -------------------------------------


def _refusal_cases():
  """(mode, the first shared run of a kind it does not take) per mode that
  names its kinds."""
  cases = []
  for name in sorted(build.parts().modes.names()):
    spec = build.parts().modes.get(name)
    if spec.kinds:
      other = next(r for r, v in RUNS.items() if not spec.takes(v[1]))
      cases.append((name, other))
  return cases


def _listing(workdir: str) -> dict[str, float]:
  out = {}
  for d, _, files in os.walk(workdir):
    for f in files:
      p = os.path.join(d, f)
      out[p] = os.path.getmtime(p)
  return out


def _assert_refused(proc, mode: str, before, workdir) -> None:
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr
  assert lines[0].startswith(f"memjax: error: --mode={mode} takes a run of")
  assert _listing(workdir) == before  # Nothing written.


@pytest.mark.parametrize("mode,run", _refusal_cases())
def test_a_mode_given_a_kind_it_does_not_take_is_one_line(
    request, mode, run, tmp_path
):
  workdir, _ = _copy(request, run, tmp_path)
  before = _listing(workdir)
  proc = run_main(f"--mode={mode}", f"--workdir={workdir}")
  _assert_refused(proc, mode, before, workdir)


def test_a_method_added_from_outside_refuses_another_kind_in_one_line(
    mt_smoke_workdir, tmp_path
):
  """docs/extending.md's toy method, added by a config file: its mode takes
  LM runs, and a translation run gets one line."""
  workdir = str(tmp_path / "run")
  shutil.copytree(mt_smoke_workdir, workdir)
  doc = os.path.join(REPO, "docs", "extending.md")
  flags = _config_flags("mt", mt_smoke_workdir)
  config = tmp_path / "toy_config.py"
  config.write_text(
      "import re\n"
      f"text = open({doc!r}).read()\n"
      "block = re.search(r'<!-- toy-method -->\\n```python\\n(.*?)```', "
      "text, re.S).group(1)\n"
      "exec(compile(block, 'toy_method', 'exec'), {})\n"
      "from configs import trime_iwslt\n\n"
      "def get_config():\n"
      "  return trime_iwslt.get_config('smoke')\n"
  )
  before = _listing(workdir)
  proc = run_main(
      f"--config={config}",
      *flags[1:],
      "--mode=gate_norms",
      f"--workdir={workdir}",
      fresh=True,  # It adds a method to the process.
  )
  _assert_refused(proc, "gate_norms", before, workdir)
