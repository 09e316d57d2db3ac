"""`DaskRunner`: Beam's DaskRunner with the fixes the project's Beam jobs need.

Beam 2.77's `apache_beam.runners.dask.dask_runner.DaskRunner` translates a
pipeline into `dask.bag` operations. On a scheduler with worker processes it
loses data without an error, in the ways this module fixes by translating
the pipeline itself (`_Translator`) while keeping Beam's `GroupByKey` and
`Flatten` operations and its pipeline overrides:

1. Outputs a DoFn emits in `finish_bundle` are dropped: the stock bundle
   function copies the outputs before it calls `finish_bundle`
   (`BatchElements`, and so `RunInference`, lose their last batch of every
   bundle). Here outputs are collected after `finish_bundle`.
2. Tagged outputs are not routed: every consumer of a multi-output ParDo gets
   all of its outputs. Here each output reaches its own consumers.
3. Only the last transform's bag is computed: a branch that does not lead to
   it (a second sink, `WriteToText`'s finalize step) never runs. Here every
   leaf of the graph is computed.
4. Side inputs are computed inside each task that reads them (once per
   bundle). Here each side input is one task, computed once and passed to
   the tasks that read it.
5. GroupByKey takes dask's default shuffle, which is the single-machine disk
   shuffle (partd files in one worker's temp folder) whenever the driver's
   client is not the process-wide default: a worker that dies takes groups
   with it. Here it is always the task shuffle.

6. A task is pure to dask, so when a worker dies dask recomputes every lost
   result some pending task still needs, including a file sink's write
   bundles after the sink's finalize step already committed their files
   (the driver still has to count the write stage's partitions): the rerun
   writes a new `beam-temp-*` folder that nobody renames or deletes. Here,
   once the job is done, the driver removes the temporary folders of the
   job's `FileBasedSink`s that the job created (`_remove_sink_temp_dirs`).

And it adds what a production job needs: fused stages (a ParDo runs in the
task of the ParDo that feeds it, elements stream through them, and a task
returns only what leaves its stage: the stock runner holds every
intermediate PCollection of a partition as a list, all the images and
grids of a partition at once in Preprocess; components/beam/dask_bundles.py
runs them); counters and distributions (`result.metrics()`: the stock
result raises NotImplementedError), collected from the tasks that
succeeded, so a task retried after a worker died counts once; a DoFn set up
once per worker thread and job, not once per bundle (RunInference keeps its
model); `Create` and `Reshuffle` spread over several partitions, so that
the work is parallel; and before anything runs, one-line errors for an
unreachable scheduler or workers without this package
(components/beam/dask_cluster.py).

Only the global window is supported (batch jobs), as in the stock runner.
Upstream notes: docs/beam.md, "Dask".
"""
from __future__ import annotations

import collections
import logging
import math
import os
import time
import uuid
from typing import Any, Callable, Optional, Sequence

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.runners.dask import dask_runner as stock
from apache_beam.runners.dask import overrides as stock_overrides
from apache_beam.runners.dask import transform_evaluator as stock_ops
from apache_beam.runners.runner import PipelineResult, PipelineState

from components.beam import dask_bundles, dask_cluster

# Create/Reshuffle: partitions per worker thread (more than one, so a slow task
# does not hold back the others), and the most elements a Create partition holds.
PARTITIONS_PER_THREAD = 4
CREATE_PARTITION_ELEMENTS = 1000


# ----------------------------------------------------------------------------- on the driver

class _Translator(PipelineVisitor):
    """Builds the dask graph of a pipeline: fused ParDo stages between Beam's primitives.

    A ParDo joins the stage of the ParDo that produces its main input (the
    stage streams elements through both in one task), unless one of its side
    inputs is computed downstream of that stage. GroupByKey, Flatten,
    Reshuffle, Create and Read are dask bag operations between stages.

    Args:
      bag_kwargs: `--dask_npartitions` / `--dask_partition_size`.
      threads: worker threads of the cluster (for the number of partitions).
    """

    def __init__(self, bag_kwargs: dict, threads: int):
        self.bag_kwargs = dict(bag_kwargs)
        self.partitions = max(1, PARTITIONS_PER_THREAD * int(threads))
        self.job = uuid.uuid4().hex
        self.nodes: list[AppliedPTransform] = []
        self.stage_of: dict = {}      # ParDo node -> its stage (a list of nodes, the root first)
        self.stages: list = []
        self.bags: dict = {}          # non-ParDo node or id(stage) -> bag
        self.readers: dict = collections.defaultdict(list)  # PCollection -> consuming nodes
        self.read_pcolls: set = set()
        self.file_sinks: list = []    # the FileBasedSinks the job writes through

    def visit_transform(self, node: AppliedPTransform) -> None:
        # Beam visits in the order transforms were applied: producers first.
        self.nodes.append(node)
        self._note_file_sink(node)

    def _note_file_sink(self, node: AppliedPTransform) -> None:
        # The write-bundle ParDos of `beam.io.Write` carry the sink (the
        # composite `WriteImpl` itself does not survive the pipeline's proto
        # round trip).
        from apache_beam.io.filebasedsink import FileBasedSink
        fn = getattr(node.transform, "fn", None)
        sink = getattr(fn, "sink", None)
        if (type(fn).__module__ == "apache_beam.io.iobase" and isinstance(sink, FileBasedSink)
                and all(sink is not s for s in self.file_sinks)):
            self.file_sinks.append(sink)

    # -- fusion

    def _plan(self) -> None:
        for node in self.nodes:
            for p in [*node.inputs, *(si.pvalue for si in node.side_inputs)]:
                if not isinstance(p, pvalue.PBegin):
                    self.readers[p].append(node)
        below = self._downstream()
        for node in self.nodes:
            if not self._is_pardo(node):
                continue
            main = next(iter(node.main_inputs.values()))
            stage = self.stage_of.get(main.producer)
            sides = {si.pvalue.producer for si in node.side_inputs}
            if stage is not None and not any(side in below[member] or side is member
                                             for member in stage for side in sides):
                stage.append(node)
            else:
                stage = [node]
                self.stages.append(stage)
            self.stage_of[node] = stage

    def _downstream(self) -> dict:
        """node -> every node that reads its outputs, directly or through others."""
        below: dict = {}
        for node in reversed(self.nodes):
            reached: set = set()
            for p in node.outputs.values():
                for reader in self.readers.get(p, ()):
                    reached.add(reader)
                    reached |= below.get(reader, set())
            below[node] = reached
        return below

    def _is_pardo(self, node: AppliedPTransform) -> bool:
        transform = node.transform
        if isinstance(transform, stock_overrides._GroupAlsoByWindow):
            return False  # GroupByKey already gave (key, values) in the global window
        if isinstance(transform, beam.WindowInto):
            self._check_global(node, transform)
        return isinstance(transform, beam.ParDo)

    # -- bags

    def _input(self, pcoll) -> Any:
        """The bag of a PCollection (built on first use)."""
        self.read_pcolls.add(pcoll)
        producer = pcoll.producer
        stage = self.stage_of.get(producer)
        if stage is None:
            return self._node_bag(producer)
        return _map("select", dask_bundles.select, self._stage_bag(stage), _exit_key(pcoll))

    def _node_bag(self, node: AppliedPTransform) -> Any:
        if node in self.bags:
            return self.bags[node]
        transform = node.transform
        inputs = [self._input(p) for p in node.inputs if not isinstance(p, pvalue.PBegin)]
        if isinstance(transform, stock_overrides._Create):
            bag = self._create(list(transform.values))
        elif isinstance(transform, stock_overrides._Read):
            bag = self._read(transform.source)
        elif isinstance(transform, stock_overrides._Reshuffle):
            bag = inputs[0].repartition(max(inputs[0].npartitions, self.partitions))
        elif isinstance(transform, stock_overrides._GroupByKeyOnly):
            # The task shuffle, named: without a default client, dask picks its disk
            # shuffle, whose files live on one worker's disk (lost with the worker).
            bag = inputs[0].groupby(dask_bundles.group_key, shuffle="tasks").map(
                dask_bundles.group_values)
        elif isinstance(transform, stock_overrides._Flatten):
            bag = stock_ops.Flatten(node).apply(inputs)
        elif isinstance(transform, stock_overrides._GroupAlsoByWindow):
            bag = inputs[0]
        else:
            raise NotImplementedError(
                f"the Dask runner cannot run {node.full_label} ({type(transform).__name__}): "
                f"use the direct runner for this pipeline")
        self.bags[node] = bag
        return bag

    def _stage_bag(self, stage: list) -> Any:
        if id(stage) in self.bags:
            return self.bags[id(stage)]
        index = {node: i for i, node in enumerate(stage)}
        side_bags: list = []
        steps = []
        for node in stage:
            transform = node.transform
            args, kwargs = transform.raw_side_inputs
            main = next(iter(node.main_inputs.values()))
            sides = []
            for si in node.side_inputs:
                sides.append((len(side_bags), type(si), si._view_options()))
                side_bags.append(self._input(si.pvalue))
            exits = {p.tag: _exit_key(p) for p in node.outputs.values()
                     if any(reader not in index or p not in reader.main_inputs.values()
                            for reader in self.readers.get(p, ()))}
            steps.append(dask_bundles.StepSpec(
                uid=f"{node.full_label}-{uuid.uuid4().hex}", label=node.full_label,
                fn=transform.fn, args=tuple(args), kwargs=dict(kwargs),
                window_fn=main.windowing.windowfn if hasattr(main, "windowing") else None,
                sides=tuple(sides), source=index.get(main.producer, -1),
                source_tag=main.tag, exits=exits))
        root_input = self._input(next(iter(stage[0].main_inputs.values())))
        bag = _map("stage", dask_bundles.run_stage, root_input,
                   dask_bundles.StageSpec(job=self.job, steps=tuple(steps)), sides=side_bags)
        self.bags[id(stage)] = bag
        return bag

    def _create(self, values: list) -> Any:
        import dask.bag as db
        if not values:
            return db.from_sequence([], npartitions=1)
        size = self.bag_kwargs.get("partition_size")
        if size:
            return db.from_sequence(values, partition_size=size)
        n = self.bag_kwargs.get("npartitions") or max(
            self.partitions, math.ceil(len(values) / CREATE_PARTITION_ELEMENTS))
        return db.from_sequence(values, npartitions=max(1, min(len(values), n)))

    def _read(self, source) -> Any:
        import dask.bag as db
        bundles = list(source.split(desired_bundle_size=64 << 20)) or []
        return (_map("read", dask_bundles.read_bundle, self._create(bundles)) if bundles
                else db.from_sequence([], npartitions=1))

    @staticmethod
    def _check_global(node: AppliedPTransform, transform) -> None:
        from apache_beam.transforms.window import GlobalWindows
        windowing = getattr(transform, "windowing", None)
        fn = getattr(windowing, "windowfn", None)
        if fn is not None and not isinstance(fn, GlobalWindows):
            raise NotImplementedError(f"the Dask runner runs the global window only, "
                                      f"not {type(fn).__name__} ({node.full_label})")

    # -- what to compute

    def outputs(self) -> tuple[list, list]:
        """`(metric bags, leaf bags)`: what the driver computes (every stage runs)."""
        self._plan()
        stage_bags = [self._stage_bag(stage) for stage in self.stages]
        other = [self._node_bag(node) for node in self.nodes
                 if node not in self.stage_of
                 and not any(p in self.read_pcolls for p in node.outputs.values())]
        metrics = [_map("metrics", dask_bundles.select, bag, dask_bundles.METRICS_TAG)
                   for bag in stage_bags]
        leaves = [_map("leaf", dask_bundles.count, bag) for bag in stage_bags + other]
        return metrics, leaves


def _exit_key(pcoll) -> str:
    """The key under which a stage's task returns one of its PCollections."""
    return f"{pcoll.producer.full_label}:{pcoll.tag}"


def _map(prefix: str, func: Callable, bag, *args, sides: Sequence = ()) -> Any:
    """`func(partition, *args, *side values)` per partition, as a graph layer of its own.

    Not `Bag.map_partitions`: dask embeds an `Item` argument into each
    consumer under a name of its own (a side input computed once per
    consumer), and fuses a partition's producer into each of its consumers
    (a stage run again for each PCollection read from it).
    """
    import dask.bag as db
    from dask.highlevelgraph import HighLevelGraph
    name = f"{prefix}-{uuid.uuid4().hex}"
    tasks: dict = {}
    side_keys = []
    for i, side in enumerate(sides):
        key = f"{name}-side{i}"
        tasks[key] = (dask_bundles.concat, [(side.name, j) for j in range(side.npartitions)])
        side_keys.append(key)
    for i in range(bag.npartitions):
        tasks[(name, i)] = (func, (bag.name, i), *args, *side_keys)
    graph = HighLevelGraph.from_collections(name, tasks, dependencies=[bag, *sides])
    return db.Bag(graph, name, bag.npartitions)


class DaskPipelineResult(PipelineResult):
    """A running Dask job: waits for every partition, gathers metrics, closes the client.

    Args:
      client: the connected `distributed.Client` (closed when the job ends).
      metric_futures, leaf_futures: futures of the metric and leaf partitions.
      on_done: called once when the job ends (stops a local cluster).
      file_sinks: the job's `FileBasedSink`s (their temporary folders are
        removed once it is done).
      started: when the job was submitted (`time.time()`).
    """

    def __init__(self, client, metric_futures: Sequence, leaf_futures: Sequence,
                 on_done: Optional[Callable[[], None]] = None,
                 file_sinks: Sequence = (), started: Optional[float] = None):
        super().__init__(PipelineState.RUNNING)
        from apache_beam.runners.direct.direct_metrics import DirectMetrics
        self.client = client
        self._metric_futures = set(metric_futures)
        self._futures = list(metric_futures) + list(leaf_futures)
        self._metrics = DirectMetrics()
        self._on_done = on_done
        self.partitions_done = 0
        self.partitions = len(self._futures)
        self.started = time.time() if started is None else started
        self._file_sinks = list(file_sinks)

    def wait_until_finish(self, duration=None) -> str:
        import distributed
        if PipelineState.is_terminal(self._state):
            return self._state
        timeout = None if duration is None else duration / 1000
        try:
            for future, value in distributed.as_completed(self._futures, loop=self.client.loop,
                                                          timeout=timeout, with_results=True):
                if future in self._metric_futures:
                    for per_step in value:
                        for updates in per_step:
                            self._metrics.commit_logical(None, updates)
                self.partitions_done += 1
            _remove_sink_temp_dirs(self._file_sinks, self.started)
            self._state = PipelineState.DONE
        except TimeoutError:
            if duration is not None:
                return self._state
            self._failed()
            raise
        except BaseException:
            self._failed()
            raise
        self._close()
        return self._state

    def _failed(self) -> None:
        self._state = PipelineState.FAILED
        try:
            self.client.cancel(self._futures)
        finally:
            self._close()

    def _close(self) -> None:
        try:
            self.client.close()
        finally:
            if self._on_done is not None:
                done, self._on_done = self._on_done, None
                done()

    def cancel(self) -> str:
        self._state = PipelineState.CANCELLING
        self.client.cancel(self._futures)
        self._state = PipelineState.CANCELLED
        self._close()
        return self._state

    def metrics(self):
        """Counters and distributions of the bundles that finished (all of them once DONE)."""
        return self._metrics


class DaskRunner(stock.DaskRunner):
    """Runs a batch pipeline on a dask.distributed cluster, without losing data.

    Options are Beam's own `DaskOptions` (`--dask_client_address`,
    `--dask_connection_timeout`, `--dask_npartitions`, ...).
    """

    def run_pipeline(self, pipeline, options):
        dask_options = options.view_as(stock.DaskOptions).get_all_options(
            drop_default=True, current_only=True)
        bag_kwargs = stock.DaskOptions._extract_bag_kwargs(dask_options)
        client = dask_cluster.connect(dask_options.get("address"),
                                      scheduler_file=dask_options.get("scheduler_file"),
                                      timeout=dask_options.get("timeout"),
                                      name=dask_options.get("name"))
        started = time.time()
        try:
            dask_cluster.check_workers(client)
            threads = sum(client.nthreads().values())
            pipeline.replace_all(stock_overrides.dask_overrides())
            translator = _Translator(bag_kwargs, threads)
            pipeline.visit(translator)
            metrics, leaves = translator.outputs()
            futures = _submit(client, metrics + leaves)
        except BaseException:
            client.close()
            raise
        n = sum(b.npartitions for b in metrics)
        return DaskPipelineResult(client, futures[:n], futures[n:],
                                  file_sinks=translator.file_sinks, started=started)


# How far a worker's clock may lag the driver's when telling this job's
# temporary folders from older ones (their names carry a uuid1 timestamp).
CLOCK_SKEW_S = 300.0
_UUID1_EPOCH = 0x01B21DD213814000  # 100 ns intervals from 1582-10-15 to 1970-01-01


def _remove_sink_temp_dirs(sinks: Sequence, started: float) -> list:
    """Removes the `beam-temp-*` folders of `sinks` created since `started`; returns them.

    FileBasedSink names its folder `<dir>/beam-temp-<last component>-<uuid1>`
    and deletes it in its finalize step; one that exists after the job ended
    was written by a write bundle dask ran again after that step (item 6 of
    the module docstring). Folders older than the job (by their uuid1's
    clock, less `CLOCK_SKEW_S`) belong to other jobs and are kept.
    """
    from apache_beam.io.filesystems import FileSystems
    removed = []
    for sink in sinks:
        prefix = sink.file_path_prefix
        prefix = prefix.get() if hasattr(prefix, "get") else prefix
        base, last = FileSystems.split(prefix)
        if "://" not in base:  # a local folder (matching lists files only, not empty folders)
            import glob
            folders = set(glob.glob(os.path.join(glob.escape(base), f"beam-temp-{last}-*")))
        else:
            try:
                found = [m.path for r in FileSystems.match([FileSystems.join(
                    base, f"beam-temp-{last}-**")]) for m in r.metadata_list]
            except Exception:  # nothing matched, or a store that cannot list
                continue
            folders = {FileSystems.join(base, p[len(base):].lstrip("/").split("/")[0])
                       for p in found}
        for folder in sorted(folders):
            name = FileSystems.split(folder)[1]
            try:
                stamp = (uuid.UUID(hex=name.rsplit("-", 1)[1]).time - _UUID1_EPOCH) / 1e7
            except (ValueError, IndexError):
                continue
            if stamp >= started - CLOCK_SKEW_S:
                try:
                    FileSystems.delete([folder])
                except OSError:  # already gone
                    continue
                removed.append(folder)
    if removed:
        logging.getLogger(__name__).info(
            "removed %d temporary folder(s) of write bundles dask ran again after their "
            "sink's finalize step: %s", len(removed), ", ".join(removed))
    return removed


def _submit(client, bags: Sequence) -> list:
    """Futures of every partition of `bags`, from one graph (a shared task runs once)."""
    from dask.highlevelgraph import HighLevelGraph
    graph = HighLevelGraph.merge(*[b.__dask_graph__() for b in bags])
    keys = [k for b in bags for k in b.__dask_keys__()]
    return client.get(dict(graph), keys, sync=False)
