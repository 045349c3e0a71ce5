"""Progress lines of long jobs: a rate always, an ETA only for known totals."""

from memjax.io import console


def _lines(capsys) -> list[str]:
  out = capsys.readouterr()
  return [l for l in (out.out + out.err).splitlines() if "keys/s" in l]


def test_known_total_gets_an_eta(capsys):
  progress = console.Progress(100, every_s=-1.0)
  progress.add(25, "shard 1/1")
  (line,) = _lines(capsys)
  assert "datastore: shard 1/1, 25 keys" in line
  # 75 keys left at the measured rate.
  rate = float(line.split(", ")[2].split()[0])
  eta = float(line.split("ETA ")[1].rstrip("s"))
  assert abs(eta - 75 / rate) <= max(1.0, 0.05 * eta)


def test_unknown_total_gets_no_eta(capsys):
  progress = console.Progress(0, every_s=-1.0)
  progress.add(25, "shard 1/1")
  (line,) = _lines(capsys)
  assert "25 keys" in line and "ETA" not in line
