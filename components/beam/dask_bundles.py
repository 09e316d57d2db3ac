"""What the Dask workers run for `components.beam.dask_runner.DaskRunner`: fused ParDo stages.

A stage is a tree of ParDos that the driver fused (docs/beam.md, "Dask"):
one task per input partition pushes each element through every DoFn of the
stage in turn, as Beam's own runners do, so that a partition's records
stream from read to write and are never all held in one list. A task
returns only what leaves the stage: `(exit key, value)` pairs for the
PCollections that other stages, a GroupByKey, a Flatten or a side input
read, then `(METRICS_TAG, [MetricUpdates per step])`.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any, Optional

import apache_beam as beam
from apache_beam.runners.common import Receiver

# The key of the one record per task that carries its steps' metric updates.
METRICS_TAG = "__captioner_metrics__"


@dataclasses.dataclass
class StepSpec:
    """One ParDo of a stage.

    Attributes:
      uid: unique per ParDo and job (the DoFn cache key).
      label: the transform's full label (the metric step name).
      fn, args, kwargs: the DoFn and its extra arguments (side inputs as placeholders).
      window_fn: the main input's window function.
      sides: `(index into the task's side values, view class, view options)` per side input.
      source: the step whose output this one reads (-1: the stage's input partition).
      source_tag: the tag of that output (None: the main output).
      exits: tag -> exit key, for outputs that leave the stage.
    """
    uid: str
    label: str
    fn: beam.DoFn
    args: tuple
    kwargs: dict
    window_fn: Any
    sides: tuple
    source: int
    source_tag: Optional[str]
    exits: dict


@dataclasses.dataclass
class StageSpec:
    """A fused stage: its steps in topological order (the first reads the partition)."""
    job: str
    steps: tuple


class _FanOut(Receiver):
    """Delivers one output tag of a step to its consumers in the stage and/or to the task's output."""

    def __init__(self, deliver, consumers: list, exit_key: Optional[str], outputs: list):
        self.deliver, self.consumers, self.exit_key, self.outputs = (
            deliver, consumers, exit_key, outputs)

    def receive(self, windowed_value) -> None:
        for j in self.consumers:
            self.deliver(j, windowed_value)
        if self.exit_key is not None:
            self.outputs.append((self.exit_key, windowed_value.value))


class _Receivers(dict):
    """tag -> `_FanOut` of one step (an output tag nobody reads is dropped)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, tag):
        receiver = self[tag] = self.make(tag)
        return receiver


# The set-up DoFns of one job, per worker thread (DoFns need not be thread-safe):
# `job` (the job's id) and `fns` (step uid -> DoFn).
_DOFNS = threading.local()


def _dofn(step: StepSpec, job: str) -> beam.DoFn:
    """This thread's instance of a step's DoFn, set up once per job.

    A worker outlives jobs: the DoFns of an earlier job (and the models they
    hold) are torn down when a task of another job arrives.
    """
    from apache_beam.runners.common import DoFnSignature
    if getattr(_DOFNS, "job", None) != job:
        for old in getattr(_DOFNS, "fns", {}).values():
            try:
                DoFnSignature(old).teardown_lifecycle_method.method_value()
            except Exception:  # noqa: BLE001 - teardown is best effort, as in Beam
                pass
        _DOFNS.job, _DOFNS.fns = job, {}
    fn = _DOFNS.fns.get(step.uid)
    if fn is None:
        fn = step.fn
        DoFnSignature(fn).setup_lifecycle_method.method_value()
        _DOFNS.fns[step.uid] = fn
    return fn


def _global(value):
    """A side-input value in the global window."""
    from apache_beam.transforms.window import GlobalWindow
    from apache_beam.utils.windowed_value import WindowedValue
    return WindowedValue(value, 0, (GlobalWindow(),))


def run_stage(elements, spec: StageSpec, *side_values) -> list:
    """Runs one partition through a fused stage.

    Args:
      elements: the partition's elements.
      spec: the stage.
      side_values: the values of every side input of the stage's steps.
    Returns:
      `(exit key, value)` pairs, outputs of `finish_bundle` included, then
      `(METRICS_TAG, [MetricUpdates per step])`.
    """
    from apache_beam.metrics.execution import MetricsContainer
    from apache_beam.runners.common import DoFnContext, DoFnInvoker, DoFnSignature, _OutputHandler
    from apache_beam.runners.dask.transform_evaluator import get_windowed_value
    from apache_beam.runners.worker import statesampler
    from apache_beam.transforms.sideinputs import SideInputMap
    from apache_beam.utils import counters

    steps = spec.steps
    outputs: list = []
    containers = [MetricsContainer(step.label) for step in steps]
    # A sampler per task: a sampler keeps the first container of each step name.
    sampler = statesampler.StateSampler("", counters.CounterFactory())
    states = [{kind: sampler.scoped_state(step.label, kind, metrics_container=c)
               for kind in ("start", "process", "finish")}
              for step, c in zip(steps, containers, strict=True)]
    consumers: dict = {}
    for j, step in enumerate(steps):
        if step.source >= 0:
            consumers.setdefault((step.source, step.source_tag), []).append(j)
    invokers: list = []

    def deliver(j: int, windowed_value) -> None:
        with states[j]["process"]:
            invokers[j].invoke_process(windowed_value)

    for i, step in enumerate(steps):
        receivers = _Receivers(lambda tag, i=i, step=step: _FanOut(
            deliver, consumers.get((i, tag), []), step.exits.get(tag), outputs))
        handler = _OutputHandler(
            window_fn=step.window_fn, main_receivers=receivers[None],
            tagged_receivers=receivers, per_element_output_counter=None,
            output_batch_converter=None, process_yields_batches=False,
            process_batch_yields_elements=False)
        side_inputs = [SideInputMap(view, options, [_global(v) for v in side_values[k]])
                       for k, view, options in step.sides]
        fn = _dofn(step, spec.job)
        invokers.append(DoFnInvoker.create_invoker(
            DoFnSignature(fn), handler, context=DoFnContext(step.label, state=None),
            side_inputs=side_inputs, input_args=list(step.args), input_kwargs=step.kwargs,
            user_state_context=None, bundle_finalizer_param=beam.DoFn.BundleFinalizerParam()))
    previous = statesampler.get_current_tracker()
    statesampler.set_current_tracker(sampler)
    try:
        for j, invoker in enumerate(invokers):
            with states[j]["start"]:
                invoker.invoke_start_bundle()
        for element in elements:
            deliver(0, get_windowed_value(element, steps[0].window_fn))
        # Producers first: what a step emits in finish_bundle still reaches its consumers.
        for j, invoker in enumerate(invokers):
            with states[j]["finish"]:
                invoker.invoke_finish_bundle()
    finally:
        statesampler.set_current_tracker(previous)
    outputs.append((METRICS_TAG, [c.get_cumulative() for c in containers]))
    return outputs


def select(pairs, key) -> list:
    """The values of one exit key from a stage's `(key, value)` pairs."""
    return [value for k, value in pairs if k == key]


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
    from apache_beam.runners.dask.transform_evaluator import defenestrate
    key, items = group
    return key, [defenestrate(item[1]) for item in items]


def read_bundle(bundles) -> list:
    """Reads `beam.io.Read` source bundles (one partition: some of a source's splits)."""
    out = []
    for bundle in bundles:
        tracker = bundle.source.get_range_tracker(bundle.start_position, bundle.stop_position)
        out.extend(bundle.source.read(tracker))
    return out
