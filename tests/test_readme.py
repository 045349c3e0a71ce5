"""The README's commands and the docs' links are true of the checkout.

Every ``make TARGET`` the README names is a target (``make -n`` succeeds),
every ``python -m MODULE`` it names answers ``--help`` (argparse's status 0,
or absl's usage and status 1, without a traceback), and
every relative link in README.md and docs/*.md points at a file that exists
(and, for ``file.md#anchor``, at a heading of that file), and every run the
examples load is one a demo of the Makefile writes.
"""

from __future__ import annotations

import concurrent.futures
import functools
import glob
import os
import re
import subprocess
import sys
import types

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(REPO, "README.md")

# `make demo-ext` in a code span, or a code-block line starting with `make`.
_MAKE = re.compile(r"(?:`|^)make ((?:[a-z][\w-]*))", re.MULTILINE)
# `python -m memjax.main`, `.venv/bin/python -m ...`; a placeholder such as
# `memjax.demos.<name>` is not a module name and is skipped.
_PYTHON_M = re.compile(r"python -m ([A-Za-z_][\w.]*\w)(?![\w.<])")
# [text](target) and ![alt](target); the target ends at the first space or ).
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def _read(path: str) -> str:
  with open(path, encoding="utf-8") as f:
    return f.read()


def make_targets(text: str) -> list[str]:
  """The make targets a Markdown text names, in order, without repeats."""
  return list(dict.fromkeys(_MAKE.findall(text)))


def python_modules(text: str) -> list[str]:
  """The modules a Markdown text runs with ``python -m``, without repeats."""
  return list(dict.fromkeys(_PYTHON_M.findall(text)))


def heading_anchors(text: str) -> set[str]:
  """GitHub's anchors of a Markdown text's headings (outside code blocks)."""
  anchors = set()
  for line in _FENCE.sub("", text).splitlines():
    m = re.match(r"#{1,6} (.*)", line)
    if m:
      title = m.group(1).strip().lower()
      title = re.sub(r"[^\w\- ]", "", title)
      anchors.add(title.replace(" ", "-"))
  return anchors


def broken_links(path: str) -> list[str]:
  """Relative links of a Markdown file whose file or heading is missing."""
  text = _read(path)
  broken = []
  for target in _LINK.findall(_FENCE.sub("", text)):
    if re.match(r"[a-z]+:", target):
      continue  # https:, mailto:
    file_part, _, anchor = target.partition("#")
    resolved = (
        os.path.normpath(os.path.join(os.path.dirname(path), file_part))
        if file_part
        else path
    )
    if not os.path.exists(resolved):
      broken.append(f"{target} (no file {os.path.relpath(resolved, REPO)})")
    elif anchor and resolved.endswith(".md"):
      if anchor not in heading_anchors(_read(resolved)):
        broken.append(f"{target} (no heading #{anchor})")
  return broken


def test_extractors_on_a_hand_written_text(tmp_path):
  text = (
      "Run `make demo` or `make demo-pkm-bert`, then\n"
      "```bash\nmake test\n.venv/bin/python -m memjax.main --help\n```\n"
      "and `python -m memjax.demos.<name>`; `python -m memjax.data.prepare`.\n"
      "It makes sense to remake `make demo`.\n"
  )
  assert make_targets(text) == ["demo", "demo-pkm-bert", "test"]
  assert python_modules(text) == ["memjax.main", "memjax.data.prepare"]

  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "a.md").write_text(
      "# A page\n\n## The demo (`make x`)\n"
  )
  page = tmp_path / "page.md"
  page.write_text(
      "[ok](docs/a.md) [ok](docs/a.md#the-demo-make-x) [web](https://x.org)\n"
      "[self](#top-heading) ![img](docs/missing.png) [bad](docs/a.md#nope)\n"
      "# Top heading\n```\n[in code](not/checked.md)\n```\n"
  )
  assert broken_links(str(page)) == [
      "docs/missing.png (no file "
      + os.path.relpath(str(tmp_path / "docs" / "missing.png"), REPO)
      + ")",
      "docs/a.md#nope (no heading #nope)",
  ]


def test_help_answer_told_from_a_crash():
  def done(rc, out, err=""):
    return subprocess.CompletedProcess([], rc, out, err)

  assert _answered_help(done(0, "usage: prepare [--corpus CORPUS]"))
  assert _answered_help(done(1, "flags:\n\nTry --helpfull to get a list"))
  assert not _answered_help(done(1, "", "Traceback (most recent call last)"))
  assert not _answered_help(done(2, "Try --helpfull"))


def test_readme_make_targets_exist():
  targets = make_targets(_read(README))
  assert {"demo", "test", "demo-lamemo", "demo-trime-mt"} <= set(targets)
  for target in targets:
    result = subprocess.run(
        ["make", "-n", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"make -n {target}: {result.stderr}"


def _help(module: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run(
      [sys.executable, "-m", module, "--help"],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      env=env,
      check=False,
  )


def test_readme_python_modules_answer_help():
  modules = python_modules(_read(README))
  assert "memjax.main" in modules
  # Two at a time: each imports JAX (a few seconds of one core).
  with concurrent.futures.ThreadPoolExecutor(2) as pool:
    results = dict(zip(modules, pool.map(_help, modules)))
  for module, result in results.items():
    assert _answered_help(result), f"{module} --help: {result.stderr[-2000:]}"


def _answered_help(result: subprocess.CompletedProcess) -> bool:
  """Whether a ``--help`` call printed its usage and exited normally.

  absl's ``--help`` prints the usage and exits with status 1 (absl.app's
  HelpFlag), argparse's with 0; a crash (a traceback) is neither.
  """
  if "Traceback" in result.stderr:
    return False
  if result.returncode == 0:
    return "--" in result.stdout + result.stderr  # it lists its flags
  return result.returncode == 1 and "Try --helpfull" in result.stdout


@pytest.mark.parametrize(
    "path",
    [README] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md"))),
    ids=os.path.basename,
)
def test_relative_links_point_at_files(path):
  assert broken_links(path) == []


# memjax.load("runs/...") and .attach("runs/...") in the README, the API's
# docstrings and docs/experiment.md; runs/mine is the reader's own run.
_EXAMPLE = re.compile(r"(?:memjax\.load|\.attach)\(\"(runs/[^\"]+)\"")
_DEMO_LINE = re.compile(r"-m memjax\.demos\.(\w+) --workdir=(\S+)")
EXAMPLE_FILES = (
    README,
    os.path.join(REPO, "docs", "experiment.md"),
    os.path.join(REPO, "memjax", "__init__.py"),
    *sorted(glob.glob(os.path.join(REPO, "memjax", "api", "*.py"))),
)


def demo_workdirs() -> dict[str, str]:
  """The Makefile's demo workdirs: workdir -> demo module."""
  text = _read(os.path.join(REPO, "Makefile"))
  default = re.search(r"^WORKDIR \?= (\S+)", text, re.MULTILINE).group(1)
  return {
      workdir.replace("$(WORKDIR)", default): module
      for module, workdir in _DEMO_LINE.findall(text)
  }


class _Trained(Exception):
  """Stops a demo where it would train."""


def demo_runs(module: str, workdir: str, monkeypatch) -> set[str]:
  """The runs (and datastores) demo ``module`` writes under ``workdir``,
  from the demo's own code: its rows' directories, or the directories it
  hands to ``common.train`` (recorded; nothing trains). Each demo module
  defines flags, so only the rows modules are imported beside memjax.demos.mt
  (which the demo tests import too)."""
  # pylint: disable=g-import-not-at-top
  from memjax.demos import common
  from memjax.demos import external_rows
  from memjax.demos import mt
  from memjax.demos import pkm_bert_rows
  from memjax.demos import trime_rows
  from memjax.eval import external as external_eval

  demo = common.Demo(workdir)
  if module == "trime":
    return {demo.run_dir(row) for row in trime_rows.ROWS}
  if module == "external":
    runs = set()
    for row in external_rows.MODELS + external_rows.ABLATIONS:
      c = common.load_config(row.config, f"{row.variant}_demo")
      scoring = types.SimpleNamespace(
          memory=types.SimpleNamespace(datastore=c.eval_memory.datastore),
          datastore_corpus=c.datastore.corpus,
      )
      run = demo.run_dir(row)
      runs |= {run, external_eval.datastore_path(scoring, run)}
    return runs
  if module == "mt":
    trained = []

    def train(config, run_dir):
      del config
      trained.append(run_dir)
      raise _Trained()

    monkeypatch.setattr(common, "train", train)
    with pytest.raises(_Trained):
      mt.run(workdir)
    return set(trained)
  if module == "pkm_bert":
    return {
        path(workdir, key)
        for key in pkm_bert_rows.ROWS
        for path in (
            pkm_bert_rows.mlm_dir,
            *(
                functools.partial(
                    pkm_bert_rows.finetune_dir, seed=int(s), frozen=False
                )
                for s in pkm_bert_rows.DEFAULT_SEEDS
            ),
        )
    }
  raise AssertionError(f"no rule for the runs of memjax.demos.{module}")


def test_example_paths_are_runs_the_demos_write(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # the demos make their workdirs
  workdirs = demo_workdirs()
  assert set(workdirs.values()) >= {"trime", "external", "mt", "pkm_bert"}
  runs = {}
  for path in EXAMPLE_FILES:
    for example in _EXAMPLE.findall(_read(path)):
      if example == "runs/mine":
        continue
      where = f"{os.path.relpath(path, REPO)}: {example}"
      workdir = next(
          (w for w in workdirs if example == w or example.startswith(w + "/")),
          None,
      )
      assert workdir, f"{where} is under no demo workdir of the Makefile"
      module = workdirs[workdir]
      if module not in runs:
        runs[module] = demo_runs(module, workdir, monkeypatch)
      assert example in runs[module], (where, sorted(runs[module]))
  assert {"trime", "external", "mt", "pkm_bert"} <= set(runs)
