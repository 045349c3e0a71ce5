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
