"""memjax.run_mode: any --mode in process, refused as memjax.main refuses."""

import os

import pytest

import memjax
from configs import trime_iwslt
from configs import trime_wt103
from memjax import errors


def test_an_unknown_mode_or_another_kind_of_run_is_one_line(tmp_path):
  with pytest.raises(errors.ConfigError, match="--mode 'nope'.*memeval"):
    memjax.run_mode("nope", trime_wt103.get_config("smoke"), str(tmp_path))
  with pytest.raises(
      errors.ConfigError,
      match=r"--mode=position_loss takes a run of kind lm .*this run is "
      r"translation/encoder_decoder",
  ):
    memjax.run_mode(
        "position_loss", trime_iwslt.get_config("smoke"), str(tmp_path)
    )
  assert not os.listdir(tmp_path)


def test_memeval_in_process_reads_the_run_named_by_init_from(
    smoke_workdir, tmp_path
):
  config = trime_wt103.get_config("smoke")
  config.train.init_from = smoke_workdir
  config.eval.max_windows = 4
  config.eval.splits = ("valid",)
  out = memjax.run_mode("memeval", config, str(tmp_path / "memeval"))
  assert os.path.isfile(tmp_path / "memeval" / "memeval.json")
  valid = out["valid"]
  assert valid["memory"]["tokens"] == valid["plain"]["tokens"] > 0


def test_the_package_names_are_the_functions_themselves():
  """One run_mode, one load: no layer that only hands on."""
  from memjax import api  # pylint: disable=g-import-not-at-top
  from memjax import dispatch  # pylint: disable=g-import-not-at-top

  assert memjax.run_mode is dispatch.run_mode
  assert memjax.load is api.load and memjax.train is api.train
  assert memjax.export is api.export
  assert {"load", "export", "train", "run_mode"} <= set(dir(memjax))
  with pytest.raises(AttributeError, match="no attribute 'nope'"):
    memjax.nope  # pylint: disable=pointless-statement
