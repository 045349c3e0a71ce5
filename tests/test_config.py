"""memjax.config: every option of the chosen kinds in the config, checked,
and left out of the signature at its default.

Each attention and feed-forward kind declares its options once, as one
frozen dataclass (``extend.kind_options``); a config that picks the kind
holds every one at its default, so any can be set from the command line,
and a run's signature holds only those set to another value.
"""

import dataclasses

import pytest

from configs import pkm_wt103
from memjax import build
from memjax import config as config_lib
from memjax import errors
from memjax.methods.pkm import layer as pkm
from memjax.methods.recurrent import lamemo
from memjax.models import attention
from memjax.models import feed_forward
from tests.conftest import run_main


def _defaults(options):
  return dataclasses.asdict(options)


def test_the_base_config_holds_every_option_of_its_kinds():
  c = config_lib.base_config()
  assert dict(c.model.attention_options) == _defaults(
      attention.VanillaOptions()
  )
  assert dict(c.model.feed_forward_options) == _defaults(
      feed_forward.FeedForwardOptions()
  )


def test_picking_a_kind_fills_its_options_and_drops_the_others_defaults():
  c = config_lib.base_config()
  config_lib.use_kinds(c, attention="lamemo", feed_forward="memory_plus")
  assert dict(c.model.attention_options) == _defaults(lamemo.LaMemoOptions())
  want = _defaults(pkm.MemoryPlusFeedForward.options)
  assert dict(c.model.feed_forward_options) == want
  assert want["gate"] and want["qk_norm"]  # Memory+'s own defaults.
  config_lib.use_kinds(c, attention="xl")
  assert not dict(c.model.attention_options)  # 'xl' takes none.


def _signature(config):
  return build.build(config, "unused").signature(100)


def test_an_option_at_its_default_leaves_the_signature_unchanged():
  c = pkm_wt103.get_config("pkm_smoke")
  filled = _signature(c)
  # The options as configs gave them before every one was filled in.
  given = ("num_keys", "heads", "topk", "k_dim", "query_norm", "read")
  bare = pkm_wt103.get_config("pkm_smoke")
  with bare.unlocked():
    bare.model.feed_forward_options = {
        k: v for k, v in bare.model.feed_forward_options.items() if k in given
    }
    bare.model.attention_options = {}
  assert _signature(bare) == filled
  options = filled["model"]["feed_forward_options"]
  assert "gate" not in options and "query_norm" not in options
  assert options["num_keys"] == 16
  c.model.feed_forward_options.gate = True
  assert _signature(c)["model"]["feed_forward_options"]["gate"] is True


def test_an_unknown_option_fails_naming_the_kinds_options():
  c = pkm_wt103.get_config("pkm_smoke")
  c.model.feed_forward_options.bogus = 1
  with pytest.raises(errors.ConfigError) as e:
    build.build(c, "unused")
  message = str(e.value)
  assert "model.feed_forward_options has bogus" in message
  assert "feed-forward kind 'pkm'" in message
  assert "gate, shared_values" in message and "\n" not in message
  c = config_lib.base_config()
  c.model.attention_options.position = "xl"  # LaMemo's, not vanilla's.
  with pytest.raises(errors.ConfigError, match="its options: num_kv_heads"):
    build.read(c, build.parts())


def test_an_unknown_option_on_the_command_line_is_one_line(tmp_path):
  proc = run_main(
      "--config=configs/pkm_wt103.py:pkm_smoke",
      f"--workdir={tmp_path}",
      "--config.model.feed_forward_options.bogus=1",
  )
  assert proc.returncode == 2
  err = proc.stderr.strip().splitlines()
  assert err[-1] == (
      "memjax: error: model.feed_forward_options has bogus, which "
      "feed-forward kind 'pkm' does not take; its options: "
      + ", ".join(_defaults(pkm.MemoryOptions()))
  )
