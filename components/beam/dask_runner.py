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
   all of its outputs. Here a ParDo's bag holds `(tag, value)` pairs and each
   consumer selects its own tag.
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

And it adds what a production job needs: counters and distributions
(`result.metrics()`: the stock result raises NotImplementedError), collected
from the bundles that succeeded, so a task retried after a worker died counts
once; a DoFn is set up once per worker thread, not once per bundle (RunInference
keeps its model); `Create` and `Reshuffle` spread their elements over several
partitions, so that the work is parallel; and before anything runs, one-line
errors for an unreachable scheduler or workers without this package
(components/beam/dask_cluster.py).

Only the global window is supported (batch jobs), as in the stock runner.
Upstream notes: docs/beam.md, "Dask".
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
import uuid
from typing import Any, Callable, Optional, Sequence

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.runners.dask import dask_runner as stock
from apache_beam.runners.dask import overrides as stock_overrides
from apache_beam.runners.common import Receiver
from apache_beam.runners.dask import transform_evaluator as stock_ops
from apache_beam.runners.runner import PipelineResult, PipelineState

from components.beam import dask_cluster

# The tag of the one record per bundle that carries its metric updates.
METRICS_TAG = "__captioner_metrics__"
# Create/Reshuffle: partitions per worker thread (more than one, so a slow task
# does not hold back the others), and the most elements a Create partition holds.
PARTITIONS_PER_THREAD = 4
CREATE_PARTITION_ELEMENTS = 1000


# ----------------------------------------------------------------------------- on the workers

@dataclasses.dataclass
class ParDoSpec:
    """What a worker needs to run one ParDo's bundles (pickled into each task)."""
    uid: str
    job: str
    label: str
    fn: beam.DoFn
    args: tuple
    kwargs: dict
    window_fn: Any
    side_views: tuple  # (view class, view options) per side input, in order


class _Receivers(dict):
    """tag -> receiver that appends `(tag, value)` to one list (None: the main output)."""

    def __init__(self, outputs: list):
        super().__init__()
        self.outputs = outputs

    def __missing__(self, tag):
        receiver = self[tag] = _TagReceiver(tag, self.outputs)
        return receiver


class _TagReceiver(Receiver):
    """Appends `(tag, value)` of each output to a list."""

    def __init__(self, tag: Optional[str], outputs: list):
        self.tag, self.outputs = tag, outputs

    def receive(self, windowed_value) -> None:
        self.outputs.append((self.tag, windowed_value.value))


# The set-up DoFns of one job, per worker thread (DoFns need not be thread-safe):
# `job` (the job's id) and `fns` (ParDo uid -> DoFn).
_DOFNS = threading.local()


def _dofn(spec: ParDoSpec) -> beam.DoFn:
    """This thread's instance of the spec's DoFn, set up once per job.

    A worker outlives jobs: the DoFns of an earlier job (and the models they
    hold) are torn down when a task of another job arrives.
    """
    from apache_beam.runners.common import DoFnSignature
    if getattr(_DOFNS, "job", None) != spec.job:
        for old in getattr(_DOFNS, "fns", {}).values():
            try:
                DoFnSignature(old).teardown_lifecycle_method.method_value()
            except Exception:  # noqa: BLE001 - teardown is best effort, as in Beam
                pass
        _DOFNS.job, _DOFNS.fns = spec.job, {}
    fn = _DOFNS.fns.get(spec.uid)
    if fn is None:
        fn = spec.fn
        DoFnSignature(fn).setup_lifecycle_method.method_value()
        _DOFNS.fns[spec.uid] = fn
    return fn


def _global(value):
    """A side-input value in the global window."""
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.windowed_value import WindowedValue
    return WindowedValue(value, 0, (GlobalWindow(),))


def run_bundle(elements, spec: ParDoSpec, *side_values) -> list:
    """Runs one bundle (a dask partition) through a DoFn.

    Args:
      elements: the partition's elements.
      spec: the ParDo.
      side_values: each side input's values, in the order of `spec.side_views`.
    Returns:
      `(tag, value)` pairs (tag None: the main output), outputs of
      `finish_bundle` included, then `(METRICS_TAG, MetricUpdates)`.
    """
    from apache_beam.metrics.execution import MetricsContainer
    from apache_beam.runners.common import (DoFnContext, DoFnInvoker, DoFnSignature,
                                            _OutputHandler)
    from apache_beam.runners.worker import statesampler
    from apache_beam.transforms.sideinputs import SideInputMap
    from apache_beam.utils import counters

    fn = _dofn(spec)
    outputs: list = []
    receivers = _Receivers(outputs)
    handler = _OutputHandler(
        window_fn=spec.window_fn, main_receivers=receivers[None], tagged_receivers=receivers,
        per_element_output_counter=None, output_batch_converter=None,
        process_yields_batches=False, process_batch_yields_elements=False)
    side_inputs = [SideInputMap(view, options, [_global(v) for v in values])
                   for (view, options), values in zip(spec.side_views, side_values)]
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn), handler, context=DoFnContext(spec.label, state=None),
        side_inputs=side_inputs, input_args=list(spec.args), input_kwargs=spec.kwargs,
        user_state_context=None, bundle_finalizer_param=beam.DoFn.BundleFinalizerParam())
    container = MetricsContainer(spec.label)
    # A sampler per bundle: a sampler keeps the first container of each step name.
    sampler = statesampler.StateSampler("", counters.CounterFactory())
    previous = statesampler.get_current_tracker()
    statesampler.set_current_tracker(sampler)
    try:
        _process_bundle(invoker, sampler, spec, container, elements)
    finally:
        statesampler.set_current_tracker(previous)
    outputs.append((METRICS_TAG, container.get_cumulative()))
    return outputs


def _process_bundle(invoker, sampler, spec: ParDoSpec, container, elements) -> None:
    """start_bundle, process each element, finish_bundle, with `container` current."""
    with sampler.scoped_state(spec.label, "process", metrics_container=container):
        invoker.invoke_start_bundle()
        for element in elements:
            invoker.invoke_process(stock_ops.get_windowed_value(element, spec.window_fn))
        invoker.invoke_finish_bundle()


def select(pairs, tag) -> list:
    """The values of one tag from a ParDo's `(tag, value)` pairs."""
    return [value for t, value in pairs if t == tag]


def concat(lists) -> list:
    """One list from a side input's partitions."""
    return list(itertools.chain.from_iterable(lists))


def count(elements) -> int:
    """How many elements a leaf partition holds (what the driver fetches of a leaf)."""
    return sum(1 for _ in elements)


def group_key(item):
    """The key of a `(key, windowed value)` element before GroupByKey."""
    return item[0]


def group_values(group) -> tuple:
    """`(key, [(key, windowed value), ...])` -> `(key, [value, ...])`."""
    key, items = group
    return key, [stock_ops.defenestrate(item[1]) for item in items]


def read_bundle(bundles) -> list:
    """Reads `beam.io.Read` source bundles (one partition: some of a source's splits)."""
    out = []
    for bundle in bundles:
        tracker = bundle.source.get_range_tracker(bundle.start_position, bundle.stop_position)
        out.extend(bundle.source.read(tracker))
    return out


# ----------------------------------------------------------------------------- on the driver

class _Translator(PipelineVisitor):
    """Builds the dask graph of a pipeline: one bag per leaf transform.

    Args:
      bag_kwargs: `--dask_npartitions` / `--dask_partition_size`.
      threads: worker threads of the cluster (for the number of partitions).
    """

    def __init__(self, bag_kwargs: dict, threads: int):
        self.bag_kwargs = dict(bag_kwargs)
        self.partitions = max(1, PARTITIONS_PER_THREAD * int(threads))
        self.bags: dict[AppliedPTransform, Any] = {}
        self.tagged: set = set()       # producers whose bags hold (tag, value) pairs
        self.consumed: set = set()
        self.pardos: list = []
        self.job = uuid.uuid4().hex

    # -- inputs

    def _input(self, pcoll) -> Any:
        producer = pcoll.producer
        self.consumed.add(producer)
        bag = self.bags[producer]
        if producer in self.tagged:
            return self._map(f"select-{pcoll.tag}", select, bag, pcoll.tag)
        return bag

    @staticmethod
    def _map(prefix: str, func: Callable, bag, *args, sides: Sequence = ()) -> Any:
        """`func(partition, *args, *side values)` per partition, as a graph layer of its own.

        Not `Bag.map_partitions`: dask embeds an `Item` argument into each
        consumer under a name of its own (a side input computed once per
        consumer), and fuses a partition's producer into each of its
        consumers (a ParDo run again for each of its tags).
        """
        import dask.bag as db
        from dask.highlevelgraph import HighLevelGraph
        name = f"{prefix}-{uuid.uuid4().hex}"
        tasks: dict = {}
        side_keys = []
        for i, side in enumerate(sides):
            key = f"{name}-side{i}"
            tasks[key] = (concat, [(side.name, j) for j in range(side.npartitions)])
            side_keys.append(key)
        for i in range(bag.npartitions):
            tasks[(name, i)] = (func, (bag.name, i), *args, *side_keys)
        graph = HighLevelGraph.from_collections(name, tasks, dependencies=[bag, *sides])
        return db.Bag(graph, name, bag.npartitions)

    # -- translations

    def visit_transform(self, node: AppliedPTransform) -> None:
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
            bag = inputs[0].groupby(group_key, shuffle="tasks").map(group_values)
        elif isinstance(transform, stock_overrides._Flatten):
            bag = stock_ops.Flatten(node).apply(inputs)
        elif isinstance(transform, (stock_overrides._GroupAlsoByWindow, beam.WindowInto)):
            self._check_global(node, transform)
            bag = inputs[0]  # GroupByKey already gave (key, values) in the global window
        elif isinstance(transform, beam.ParDo):
            bag = self._pardo(node, inputs[0])
        elif type(transform).__name__ == "Impulse":
            bag = self._create([b""])
        else:
            raise NotImplementedError(
                f"the Dask runner cannot run {node.full_label} ({type(transform).__name__}): "
                f"use the direct runner for this pipeline")
        self.bags[node] = bag

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
        return self._map("read", read_bundle, self._create(bundles)) if bundles else \
            db.from_sequence([], npartitions=1)

    @staticmethod
    def _check_global(node: AppliedPTransform, transform) -> None:
        from apache_beam.transforms.window import GlobalWindows
        windowing = getattr(transform, "windowing", None)
        fn = getattr(windowing, "windowfn", None)
        if fn is not None and not isinstance(fn, GlobalWindows):
            raise NotImplementedError(f"the Dask runner runs the global window only, "
                                      f"not {type(fn).__name__} ({node.full_label})")

    def _pardo(self, node: AppliedPTransform, bag) -> Any:
        transform = node.transform
        args, kwargs = transform.raw_side_inputs
        main = next(iter(node.main_inputs.values()))
        spec = ParDoSpec(
            uid=f"{node.full_label}-{uuid.uuid4().hex}", job=self.job, label=node.full_label,
            fn=transform.fn, args=tuple(args), kwargs=dict(kwargs),
            window_fn=main.windowing.windowfn if hasattr(main, "windowing") else None,
            side_views=tuple((type(si), si._view_options()) for si in node.side_inputs))
        sides = [self._input(si.pvalue) for si in node.side_inputs]
        out = self._map("pardo", run_bundle, bag, spec, sides=sides)
        self.tagged.add(node)
        self.pardos.append(node)
        return out

    # -- what to compute

    def outputs(self) -> tuple[list, list]:
        """`(metric bags, leaf bags)`: what the driver computes."""
        metrics = [self._map("metrics", select, self.bags[node], METRICS_TAG)
                   for node in self.pardos]
        leaves = [self._map("leaf", count, bag) for node, bag in self.bags.items()
                  if node not in self.consumed and bag is not None]
        return metrics, leaves


class DaskPipelineResult(PipelineResult):
    """A running Dask job: waits for every partition, gathers metrics, closes the client.

    Args:
      client: the connected `distributed.Client` (closed when the job ends).
      metric_futures, leaf_futures: futures of the metric and leaf partitions.
      on_done: called once when the job ends (stops a local cluster).
    """

    def __init__(self, client, metric_futures: Sequence, leaf_futures: Sequence,
                 on_done: Optional[Callable[[], None]] = None):
        super().__init__(PipelineState.RUNNING)
        from apache_beam.runners.direct.direct_metrics import DirectMetrics
        self.client = client
        self._metric_futures = set(metric_futures)
        self._futures = list(metric_futures) + list(leaf_futures)
        self._metrics = DirectMetrics()
        self._on_done = on_done
        self.partitions_done = 0
        self.partitions = len(self._futures)
        self.started = time.time()

    def wait_until_finish(self, duration=None) -> str:
        import distributed
        if PipelineState.is_terminal(self._state):
            return self._state
        timeout = None if duration is None else duration / 1000
        try:
            for future, value in distributed.as_completed(self._futures, loop=self.client.loop,
                                                          timeout=timeout, with_results=True):
                if future in self._metric_futures:
                    for updates in value:
                        self._metrics.commit_logical(None, updates)
                self.partitions_done += 1
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
        return DaskPipelineResult(client, futures[:n], futures[n:])


def _submit(client, bags: Sequence) -> list:
    """Futures of every partition of `bags`, from one graph (a shared task runs once)."""
    from dask.highlevelgraph import HighLevelGraph
    graph = HighLevelGraph.merge(*[b.__dask_graph__() for b in bags])
    keys = [k for b in bags for k in b.__dask_keys__()]
    return client.get(dict(graph), keys, sync=False)
