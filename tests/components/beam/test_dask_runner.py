"""components.beam.dask_runner.DaskRunner against Beam's own DaskRunner, on one local cluster.

Each bug of the stock runner (Beam 2.77) is shown failing there and passing
through the adapter, on the same two worker processes: outputs of
`finish_bundle`, tagged outputs, sinks off the last branch, side inputs,
metrics. Outputs are collected by a DoFn that writes each element to a file
of its own in `process` (what every runner runs).
"""
from __future__ import annotations

import os
import time
import uuid

import apache_beam as beam
import pytest
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from components.beam import beam_utils, dask_cluster

STOCK = "apache_beam.runners.dask.dask_runner.DaskRunner"
ADAPTER = beam_utils.DASK_RUNNER


@pytest.fixture(scope="module")
def cluster():
    c = dask_cluster.start_local_cluster(2)
    yield c
    c.close()


class WriteEach(beam.DoFn):
    """Writes each element to a file of its own under `folder` (in `process`)."""

    def __init__(self, folder: str):
        self.folder = folder

    def process(self, element):
        with open(os.path.join(self.folder, uuid.uuid4().hex), "w") as f:
            f.write(repr(element))


def collected(folder: str) -> list:
    """What `WriteEach` wrote."""
    out = []
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            out.append(eval(f.read()))  # noqa: S307 - our own repr() of ints and tuples
    return out


def run(runner: str, address: str, build, *args: str) -> object:
    """Builds a pipeline with `build(p)` and runs it to the end on `runner`."""
    p = beam.Pipeline(options=PipelineOptions([f"--runner={runner}",
                                               f"--dask_client_address={address}", *args]))
    build(p)
    result = p.run()
    try:
        result.wait_until_finish()
    finally:
        client = getattr(result, "client", None)
        if client is not None and client.status != "closed":
            client.close()
    return result


def test_runner_name_maps_beams_dask_runner_to_the_adapter():
    assert beam_utils.runner_name("dask") == ADAPTER
    assert beam_utils.runner_name(STOCK) == ADAPTER
    with beam_utils.pipeline_options("direct", [f"--runner={STOCK}",
                                                "--dask_client_address=tcp://h:1"]) as opts:
        assert opts.get_all_options()["runner"] == ADAPTER


def _batches(out):
    def build(p):
        _ = (p | beam.Create(range(100))
             | beam.BatchElements(min_batch_size=8, max_batch_size=8)
             | beam.FlatMap(lambda batch: batch)
             | beam.ParDo(WriteEach(out)))
    return build


def test_outputs_of_finish_bundle_are_kept(cluster, tmp_path):
    stock, adapted = tmp_path / "stock", tmp_path / "adapted"
    stock.mkdir(), adapted.mkdir()
    run(STOCK, cluster.scheduler_address, _batches(str(stock)))
    run(ADAPTER, cluster.scheduler_address, _batches(str(adapted)))
    # BatchElements emits its last, partial batch of a bundle in finish_bundle.
    assert len(collected(str(stock))) < 100
    assert sorted(collected(str(adapted))) == list(range(100))


class OddEven(beam.DoFn):
    def process(self, x):
        yield beam.pvalue.TaggedOutput("odd", x) if x % 2 else x


def _tags(out):
    def build(p):
        parts = p | beam.Create(range(10)) | beam.ParDo(OddEven()).with_outputs("odd",
                                                                                 main="even")
        _ = ((parts.even | "Even" >> beam.Map(lambda x: ("even", x)),
              parts.odd | "Odd" >> beam.Map(lambda x: ("odd", x)))
             | beam.Flatten() | beam.ParDo(WriteEach(out)))
    return build


def test_tagged_outputs_reach_their_own_consumers(cluster, tmp_path):
    stock, adapted = tmp_path / "stock", tmp_path / "adapted"
    stock.mkdir(), adapted.mkdir()
    run(STOCK, cluster.scheduler_address, _tags(str(stock)))
    run(ADAPTER, cluster.scheduler_address, _tags(str(adapted)))
    expected = sorted([("even", x) for x in range(0, 10, 2)] + [("odd", x) for x in range(1, 10, 2)])
    assert len(collected(str(stock))) == 20  # every consumer got all ten
    assert sorted(collected(str(adapted))) == expected


def _two_sinks(folder):
    def build(p):
        _ = (p | "A" >> beam.Create(["a", "b", "c"])
             | "WriteA" >> beam.io.WriteToText(os.path.join(folder, "a"),
                                                shard_name_template="", num_shards=1))
        _ = (p | "B" >> beam.Create(["x", "y"])
             | "WriteB" >> beam.io.WriteToText(os.path.join(folder, "b"),
                                                shard_name_template=""))
    return build


def _text(path):
    return sorted(open(path).read().split()) if os.path.exists(path) else None


def test_every_sink_runs_and_is_finalized(cluster, tmp_path):
    stock, adapted = tmp_path / "stock", tmp_path / "adapted"
    stock.mkdir(), adapted.mkdir()
    try:
        run(STOCK, cluster.scheduler_address, _two_sinks(str(stock)))
    except Exception:  # noqa: BLE001 - the stock runner may also fail outright
        pass
    stock_files = {n: _text(str(stock / n)) for n in ("a", "b")}
    stock_temp = [n for n in os.listdir(stock) if n.startswith("beam-temp")]
    assert stock_files != {"a": ["a", "b", "c"], "b": ["x", "y"]} or stock_temp
    run(ADAPTER, cluster.scheduler_address, _two_sinks(str(adapted)))
    assert sorted(os.listdir(adapted)) == ["a", "b"]  # no beam-temp-* folder left
    assert _text(str(adapted / "a")) == ["a", "b", "c"]
    assert _text(str(adapted / "b")) == ["x", "y"]


def _uuid1_at(seconds: float) -> str:
    """The hex of a uuid1 whose timestamp is `seconds` (Unix time)."""
    t = int(seconds * 1e7) + 0x01B21DD213814000
    return uuid.UUID(fields=(t & 0xFFFFFFFF, (t >> 32) & 0xFFFF, ((t >> 48) & 0x0FFF) | 0x1000,
                             0x80, 0, 1)).hex


def _leave_temp_folder(folder):
    # What a write bundle that dask ran again after the finalize step leaves:
    # a `beam-temp-<name>-<uuid1>` folder of this job that nobody deletes.
    path = os.path.join(folder, f"beam-temp-a-{uuid.uuid1().hex}")
    os.makedirs(path)
    open(os.path.join(path, uuid.uuid4().hex), "w").close()


def test_temporary_folders_a_rerun_bundle_leaves_are_removed_older_ones_kept(cluster, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    older = out / f"beam-temp-a-{_uuid1_at(time.time() - 3600)}"  # another job's, an hour ago
    older.mkdir()

    def build(p):
        _ = p | "Text" >> beam.Create(["a", "b"]) | beam.io.WriteToText(
            str(out / "a"), shard_name_template="")
        _ = p | "Late" >> beam.Create([0]) | beam.Map(lambda _: _leave_temp_folder(str(out)))

    run(ADAPTER, cluster.scheduler_address, build)
    assert sorted(os.listdir(out)) == sorted(["a", older.name])
    assert _text(str(out / "a")) == ["a", "b"]


class Mark(beam.DoFn):
    """Leaves a file each time it runs (to count how often a side input is computed)."""

    def __init__(self, folder):
        self.folder = folder

    def process(self, x):
        open(os.path.join(self.folder, uuid.uuid4().hex), "w").close()
        yield x * 10


def _side(marks, out):
    def build(p):
        side = p | "One" >> beam.Create([4]) | "Mark" >> beam.ParDo(Mark(marks))
        _ = (p | beam.Create(range(40))
             | beam.Map(lambda x, s: (x, s), beam.pvalue.AsSingleton(side))
             | beam.ParDo(WriteEach(out)))
    return build


# Four bundles read the side input (the stock runner makes one partition of < 128 elements).
PARTS = ("--dask_npartitions=4",)


def test_a_side_input_is_computed_once(cluster, tmp_path):
    for name in ("stock-marks", "stock", "marks", "out"):
        (tmp_path / name).mkdir()
    try:
        run(STOCK, cluster.scheduler_address, _side(str(tmp_path / "stock-marks"),
                                                    str(tmp_path / "stock")), *PARTS)
        stock_runs = len(os.listdir(tmp_path / "stock-marks"))
    except Exception:  # noqa: BLE001 - a side input computed inside a worker task may fail
        stock_runs = None
    run(ADAPTER, cluster.scheduler_address, _side(str(tmp_path / "marks"), str(tmp_path / "out")),
        *PARTS)
    assert stock_runs != 1
    assert len(os.listdir(tmp_path / "marks")) == 1
    assert sorted(collected(str(tmp_path / "out"))) == [(x, 40) for x in range(40)]


class Count(beam.DoFn):
    def setup(self):
        self.seen = Metrics.counter("test", "seen")
        self.sizes = Metrics.distribution("test", "size")

    def process(self, x):
        self.seen.inc()
        self.sizes.update(x)
        yield x


def test_metrics_are_reported_once_per_element(cluster, tmp_path):
    def build(p):
        _ = p | beam.Create(range(50)) | "C1" >> beam.ParDo(Count()) | "C2" >> beam.ParDo(Count())

    with pytest.raises(NotImplementedError):
        run(STOCK, cluster.scheduler_address, build).metrics()
    result = run(ADAPTER, cluster.scheduler_address, build)
    assert beam_utils.counters(result, "test") == {"seen": 100}
    sizes = beam_utils.distributions(result, "test")["size"]
    assert sizes["count"] == 100 and sizes["sum"] == 2 * sum(range(50))


def test_an_unreachable_scheduler_fails_in_seconds_naming_it():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    address = f"tcp://127.0.0.1:{port}"
    p = beam.Pipeline(options=PipelineOptions([f"--runner={ADAPTER}",
                                               f"--dask_client_address={address}",
                                               "--dask_connection_timeout=3"]))
    _ = p | beam.Create([1])
    start = time.monotonic()
    with pytest.raises(dask_cluster.ClusterError) as info:
        p.run()
    assert time.monotonic() - start < 20
    message = str(info.value)
    assert address in message and "\n" not in message
    assert "dask scheduler" in message


def test_dofn_errors_fail_the_job(cluster):
    def boom(x):
        raise ValueError(f"bad element {x}")

    def build(p):
        _ = p | beam.Create([1, 2]) | beam.Map(boom)

    with pytest.raises(ValueError, match="bad element"):
        run(ADAPTER, cluster.scheduler_address, build)


class SetupMarks(beam.DoFn):
    """Leaves a `setup-*` file per setup, a `teardown-*` per teardown, a `bundle-*` per bundle."""

    def __init__(self, folder):
        self.folder = folder

    def _mark(self, kind):
        open(os.path.join(self.folder, f"{kind}-{uuid.uuid4().hex}"), "w").close()

    def setup(self):
        self._mark("setup")

    def start_bundle(self):
        self._mark("bundle")

    def process(self, x):
        yield x

    def teardown(self):
        self._mark("teardown")


def test_a_dofn_is_set_up_once_per_worker_thread_and_torn_down_by_the_next_job(cluster, tmp_path):
    def build(p):
        _ = p | beam.Create(range(40)) | beam.ParDo(SetupMarks(str(tmp_path)))

    def marks(kind):
        return len([n for n in os.listdir(tmp_path) if n.startswith(kind)])

    run(ADAPTER, cluster.scheduler_address, build, "--dask_npartitions=8")
    assert marks("bundle") == 8
    assert 1 <= marks("setup") <= 2 and marks("teardown") == 0  # two worker threads
    first = marks("setup")
    run(ADAPTER, cluster.scheduler_address, build, "--dask_npartitions=8")
    assert marks("bundle") == 16
    assert marks("setup") <= first + 2
    assert marks("teardown") >= 1  # a thread that ran both jobs let the first one's DoFn go
