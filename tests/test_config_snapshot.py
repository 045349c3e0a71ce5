"""The configs' keys, defaults and types are those the snapshot recorded.

``tests/fixtures/configs/snapshot.json`` (``make_config_snapshot.py``) holds
every leaf of the base config and, for every variant of every
``configs/*.py``, the leaves that differ from it, with their types (an
override is parsed into the default's type). Built anew here, they must
agree: the ConfigDict is the user's interface, and a refactoring of what
reads it must leave it as it was.
"""

import json
import os

from tests.fixtures import make_config_snapshot as snap


def test_every_key_default_and_type_is_as_recorded():
  with open(snap.OUT, encoding="utf-8") as f:
    want = json.load(f)
  got = json.loads(json.dumps(snap.snapshot()))
  assert sorted(got) == sorted(want)
  assert got["base"] == want["base"]
  bad = [k for k in want if got[k] != want[k]]
  assert not bad, f"{len(bad)} variants differ, e.g. {bad[:3]}: " + str(
      {
          k: (got[bad[0]].get(k), v)
          for k, v in want[bad[0]].items()
          if got[bad[0]].get(k) != v
      }
  )


def test_the_snapshot_covers_every_config_file():
  names = {k.split(":")[0] for k in json.load(open(snap.OUT)) if ":" in k}
  assert names == set(snap.config_files())
  assert os.path.basename(snap.OUT) == "snapshot.json"


FILLED_OPTIONS = ("model.attention_options.", "model.feed_forward_options.")
# Keys added since the old snapshot was written: every variant holds their
# defaults.
ADDED = (
    "plan.buffers",
    "generate.prompts",
    "generate.batch_size",
    "generate.greedy",
    "generate.top_k",
    "generate.memory",
)
OLD = os.path.join(os.path.dirname(snap.OUT), "snapshot_old_keys.json")


def _full(snapshot: dict, variant: str) -> dict:
  """Every leaf of a variant: the base's, updated with the variant's."""
  return {**snapshot["base"], **snapshot.get(variant, {})}


def test_the_old_keys_read_as_the_new_ones_in_every_variant():
  """``snapshot_old_keys.json`` is the snapshot written before the methods'
  keys moved into their own sections (``loss.memory`` -> ``trime.memory``,
  ...): each of its variants, its keys translated by the one table, is
  today's, but for the sections that had no keys then (the external
  memory of translation, MARGE's batches) holding their defaults."""
  from memjax import build  # pylint: disable=g-import-not-at-top
  from memjax import settings as settings_lib  # pylint: disable=g-import-not-at-top

  table = build.parts().renames
  with open(OLD, encoding="utf-8") as f:
    old = json.load(f)
  with open(snap.OUT, encoding="utf-8") as f:
    new = json.load(f)
  assert sorted(old) == sorted(new)
  moved = 0
  for variant in old:
    got = {}
    for key, value in _full(old, variant).items():
      got[settings_lib.new_key(key, table) or key] = value
      moved += settings_lib.new_key(key, table) is not None
    want = _full(new, variant)
    for key in FILLED_OPTIONS:  # an empty leaf then, the kind's options now
      if got.get(key[:-1]) == {} and key[:-1] not in want:
        del got[key[:-1]]
    assert {k: want.get(k) for k in got} == got, variant
    for key in set(want) - set(got):
      new_section = key.split(".")[0] in ("mt_memory", "marge")
      filled_option = key.startswith(FILLED_OPTIONS)
      assert new_section or filled_option or key in ADDED, (variant, key)
      if new_section or key in ADDED:
        assert want[key] == new["base"][key], (variant, key)
  assert moved > 100  # every variant moves some (TRIME's, the cache's...)


def test_every_variant_builds(tmp_path):
  """Every variant of every ``configs/*.py`` passes ``build.build``'s checks
  (the llama_pkm ones count their memory layer from the end)."""
  from memjax import build  # pylint: disable=g-import-not-at-top

  built = 0
  for name in snap.config_files():
    module = snap.load(name)
    for variant in snap.variants(module):
      build.build(module.get_config(variant), str(tmp_path / "unused"))
      built += 1
  assert built > 150
  pkm = snap.load("pretrained.py").get_config("llama_pkm")
  m = build.build(pkm, str(tmp_path / "unused")).settings.model
  assert tuple(pkm.model.feed_forward_layers) == (-2,)
  assert m.feed_forward_layers == (m.num_layers - 1,)
