"""memjax.io.events: TensorBoard events without TensorFlow, on any path."""

import fsspec
import numpy as np
from tensorboard.backend.event_processing import event_accumulator

from memjax.io import paths
from memjax.io import events


def test_events_read_back_by_tensorboard(tmp_path):
  writer = events.EventWriter(str(tmp_path))
  writer.write_scalars(1, {"train/loss": 2.5, "valid/ppl": np.float32(7)})
  writer.write_scalars(2, {"train/loss": np.asarray(1.25)})
  writer.close()
  # TensorBoard's own reader (what `tensorboard --logdir` uses).
  acc = event_accumulator.EventAccumulator(str(tmp_path))
  acc.Reload()
  assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [
      (1, 2.5),
      (2, 1.25),
  ]
  assert [(e.step, e.value) for e in acc.Scalars("valid/ppl")] == [(1, 7.0)]


def test_a_url_gets_whole_files_at_each_flush():
  fs = fsspec.filesystem("memory")
  logdir = "memory://summaries_test/run"
  writer = events.EventWriter(logdir)
  writer.write_scalars(3, {"loss": 1.0})
  writer.flush()  # Closes the object: visible now.
  assert len(paths.listdir(logdir)) == 1
  writer.write_scalars(4, {"loss": 0.5})
  writer.close()
  assert len(paths.listdir(logdir)) == 2  # The continuation file.
  assert events.read_scalars(logdir) == {"loss": [(3, 1.0), (4, 0.5)]}
  fs.rm("/summaries_test", recursive=True)


def test_other_processes_write_nothing(tmp_path):
  writer = events.EventWriter(str(tmp_path / "x"), just_logging=True)
  writer.write_scalars(1, {"loss": 1.0})
  writer.close()
  assert not (tmp_path / "x").exists()


def test_tensor_scalars_of_other_writers_read_back(tmp_path):
  # tf.summary v2 (CLU's writer) stores scalars as tensors.
  from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  from tensorboard.compat.proto import summary_pb2  # pylint: disable=g-import-not-at-top
  from tensorboard.summary.writer import record_writer  # pylint: disable=g-import-not-at-top
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top

  value = summary_pb2.Summary.Value(
      tag="loss", tensor=tensor_util.make_tensor_proto(np.float32(0.75))
  )
  event = event_pb2.Event(step=9, summary=summary_pb2.Summary(value=[value]))
  with open(tmp_path / "events.out.tfevents.1.other", "wb") as f:
    record_writer.RecordWriter(f).write(event.SerializeToString())
  assert events.read_scalars(str(tmp_path)) == {"loss": [(9, 0.75)]}
