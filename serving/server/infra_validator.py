"""InfraValidator: would TensorFlow Serving load and run this SavedModel?

TF Serving does not restore Python objects: its C++ loader reads the
MetaGraph tagged `serve`, restores the variables into a session and runs
each signature's tensors by name (`Session::Run`). A SavedModel that only
works through Python's `tf.saved_model.load` (say, because its graph calls
back into Python with `tf.py_function`) loads in a notebook and fails in
production. Before the Pusher publishes a version, `validate` checks, in a
separate process (a crash or a hang cannot take the caller down, and no
Python function registered by the caller can make a PyFunc op appear to
work):

1. every op of the graph and of its function library is registered in
   stock TensorFlow, and none calls back into Python (`PyFunc`,
   `PyFuncStateless`, `EagerPyFunc`);
2. the MetaGraph loads with `tf.compat.v1.saved_model.loader.load` in
   graph mode, the closest stand-in for TF Serving's loader;
3. each warmup request (`assets.extra/tf_serving_warmup_requests`) runs
   through its signature (`serving_default` by default) by tensor name, and
   every output has the request's batch size as dimension 0.

The report records the ops used and the TensorFlow version that wrote the
model. Run alone: `python -m serving.server.infra_validator VERSION_DIR`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

# Ops that call back into the Python interpreter: TF Serving has none.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})
SERVE_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"
WARMUP_FILE = os.path.join("assets.extra", "tf_serving_warmup_requests")
MAX_WARMUP_RECORDS = 1000  # TF Serving's limit


class InfraValidationError(Exception):
    """A SavedModel TF Serving could not load or run; the message says why."""


def validate(version_dir: str, timeout: float = 600.0) -> Dict[str, Any]:
    """Checks a SavedModel version folder in a child process (see module doc).

    Args:
      version_dir: the folder holding `saved_model.pb`.
      timeout: seconds before the check counts as failed.
    Returns:
      The report: `ok` (bool), `reason` (why not, or ""), `ops` (sorted op
      types of the graph and its functions), `tensorflow_version` (that
      wrote the model), `checked_with` (TF version of the check),
      `signatures`, `warmup_requests` (how many ran).
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    command = [sys.executable, "-m", "serving.server.infra_validator", os.path.abspath(version_dir)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=_repo_root())
    except subprocess.TimeoutExpired:
        return _failed(f"the check did not finish within {timeout:.0f} s")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        return _failed(f"the check process exited with status {done.returncode}: {tail}")
    return json.loads(lines[-1])


def _repo_root() -> str:
    """The folder `serving` is imported from, so the child imports the same code."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _failed(reason: str) -> Dict[str, Any]:
    return {"ok": False, "reason": reason, "ops": [], "tensorflow_version": "",
            "checked_with": "", "signatures": [], "warmup_requests": 0}


def graph_ops(meta_graph) -> List[str]:
    """Sorted op types used by a MetaGraphDef's graph and its function library."""
    graph = meta_graph.graph_def
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return sorted(ops)


def check_ops(ops: List[str]) -> List[str]:
    """The problems with `ops`: Python callbacks and ops unknown to stock TensorFlow."""
    from tensorflow.python.framework import op_def_registry

    problems = []
    python_ops = sorted(set(ops) & PYTHON_OPS)
    if python_ops:
        problems.append(f"the graph calls back into Python ({', '.join(python_ops)}, from "
                        f"tf.py_function / tf.numpy_function), which TF Serving cannot run")
    unknown = sorted(op for op in ops if op not in PYTHON_OPS and op_def_registry.get(op) is None)
    if unknown:
        problems.append(f"ops not registered in stock TensorFlow: {', '.join(unknown)}")
    return problems


def check(version_dir: str) -> Dict[str, Any]:
    """The checks themselves, in this process (the child's side of `validate`)."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow_serving.apis import prediction_log_pb2

    report = _failed("")
    report["checked_with"] = tf.__version__
    pb = os.path.join(version_dir, "saved_model.pb")
    try:
        with open(pb, "rb") as f:
            saved_model = saved_model_pb2.SavedModel.FromString(f.read())
    except (OSError, ValueError, DecodeError) as e:
        return dict(report, reason=f"cannot read {pb}: {e}")
    meta_graphs = [m for m in saved_model.meta_graphs if SERVE_TAG in m.meta_info_def.tags]
    if not meta_graphs:
        return dict(report, reason=f"no MetaGraph tagged '{SERVE_TAG}'")
    meta_graph = meta_graphs[0]
    report["tensorflow_version"] = meta_graph.meta_info_def.tensorflow_version
    report["ops"] = graph_ops(meta_graph)
    report["signatures"] = sorted(k for k in meta_graph.signature_def if not k.startswith("__"))
    problems = check_ops(report["ops"])
    if problems:
        return dict(report, reason="; ".join(problems))
    if DEFAULT_SIGNATURE not in meta_graph.signature_def:
        return dict(report, reason=f"no '{DEFAULT_SIGNATURE}' signature")

    graph = tf.Graph()
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as session:
        try:
            loaded = tf.compat.v1.saved_model.loader.load(session, [SERVE_TAG], version_dir)
        except Exception as e:  # any failure to load is the finding
            return dict(report, reason=f"the session-based loader failed: "
                                       f"{type(e).__name__}: {_first_line(e)}")
        warmup = os.path.join(version_dir, WARMUP_FILE)
        count = 0
        if os.path.exists(warmup):
            for record in tf.compat.v1.io.tf_record_iterator(warmup):
                count += 1
                if count > MAX_WARMUP_RECORDS:
                    return dict(report, reason=f"more than {MAX_WARMUP_RECORDS} warmup records")
                entry = prediction_log_pb2.PredictionLog.FromString(record)
                if entry.WhichOneof("log_type") != "predict_log":
                    return dict(report, reason=f"warmup record {count} is not a predict_log")
                problem = _run_request(session, loaded, entry.predict_log.request)
                if problem:
                    return dict(report, reason=f"warmup request {count}: {problem}")
        report["warmup_requests"] = count
    return dict(report, ok=True, reason="")


def _run_request(session, meta_graph, request) -> str:
    """Runs one PredictRequest by tensor name; returns the problem, or ""."""
    import tensorflow as tf

    key = request.model_spec.signature_name or DEFAULT_SIGNATURE
    signature = meta_graph.signature_def.get(key)
    if signature is None:
        return f"signature '{key}' not found"
    if set(request.inputs) != set(signature.inputs):
        return (f"inputs {sorted(request.inputs)} do not match the signature's "
                f"{sorted(signature.inputs)}")
    feed = {signature.inputs[alias].name: tf.make_ndarray(proto)
            for alias, proto in request.inputs.items()}
    fetches = {alias: info.name for alias, info in signature.outputs.items()}
    try:
        outputs = session.run(fetches, feed_dict=feed)
    except Exception as e:
        return f"Session.run failed: {type(e).__name__}: {_first_line(e)}"
    batch = {len(array) if getattr(array, "ndim", 0) else None for array in feed.values()}
    for alias, value in outputs.items():
        if getattr(value, "ndim", 0) == 0 or {value.shape[0]} != batch:
            return (f"output '{alias}' has shape {list(getattr(value, 'shape', []))}: "
                    f"dimension 0 must be the batch ({sorted(b for b in batch if b)}) for "
                    f"TF Serving's batching")
    return ""


def _first_line(error: Exception) -> str:
    text = getattr(error, "message", None) or str(error)
    return text.strip().splitlines()[0][:500] if text.strip() else ""


def main(argv=None) -> int:
    """`python -m serving.server.infra_validator VERSION_DIR`: prints the report as one JSON line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m serving.server.infra_validator VERSION_DIR", file=sys.stderr)
        return 2
    report = check(argv[0])
    print(json.dumps(report), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
