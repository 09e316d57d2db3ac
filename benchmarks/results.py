"""Where the benchmarks record their runs: one JSON file per run in `benchmarks/results/`.

Every benchmark script ends by calling `write_result` with its figures:

    from benchmarks.results import write_result

    def main(argv=None):
        ...
        result = {"ours_s_per_step": 0.41, "ratio": 2.3}
        print(json.dumps(result))
        write_result("train_step", result, argv=argv)
        # -> benchmarks/results/train_step-2026-11-27-amd-epyc-2c-bf16.json
        return result

The file is `benchmarks/results/<benchmark>-<UTC date>-<host tag>.json` and
holds:

    {"benchmark": "train_step",
     "date": "2026-11-27T06:10:00Z",
     "host": {"cpu": "AMD EPYC", "cores": 2, "tag": "amd-epyc-2c-bf16",
              "flags": {"avx2": true, "avx512f": true, "avx512_bf16": true, "amx": false},
              "python": "3.12.3", "platform": "Linux-..."},
     "command": "python benchmarks/train_step.py --repeats 3",
     "figures": {...}}

A second run of the same benchmark on the same host and day replaces the
file; pass `variant` to keep runs of different modes apart
(`decode-mixed_bfloat16-2026-11-27-...json`).

Under pytest (`PYTEST_CURRENT_TEST` set, subprocesses included) nothing is
written unless `BENCHMARK_RESULTS_DIR` names a folder, so tests that run a
benchmark leave the tree clean. `BENCHMARK_RESULTS_DIR` also redirects a
normal run. Importing this module imports neither TensorFlow nor numpy.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import sys
from typing import Any, Dict, Mapping, Optional, Sequence

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
ENV_DIR = "BENCHMARK_RESULTS_DIR"

# The flags that decide the speed of our matmuls: AVX2 (float32 baseline),
# AVX-512, native bfloat16 (avx512_bf16) and AMX (amx_tile / amx_bf16).
HOST_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx")


def cpuinfo() -> tuple[str, set]:
    """The CPU model name and flag set of /proc/cpuinfo (platform's processor where absent)."""
    model, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or "unknown", flags


def host_tag(cpu: str, cores: int, flags: Mapping[str, bool]) -> str:
    """A short file-name tag for a host: `amd-epyc-2c-bf16`, `intel-xeon-platinum-8375c-8c-avx512`.

    The CPU model without trademarks, clock and core-count words, the cores,
    and the best of amx / bf16 / avx512 / avx2 the CPU has.
    """
    name = re.sub(r"\((r|tm)\)|@.*$|\bcpu\b|\bprocessor\b|\b\d+-core\b", " ", cpu.lower())
    name = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown"
    isa = ("amx" if flags.get("amx") else "bf16" if flags.get("avx512_bf16")
           else "avx512" if flags.get("avx512f") else "avx2" if flags.get("avx2") else "noavx2")
    return f"{name}-{cores}c-{isa}"


def host() -> Dict[str, Any]:
    """The host a benchmark ran on: CPU model, usable cores, the flags of `HOST_FLAGS`, tag."""
    cpu, flags = cpuinfo()
    present = {"avx2": "avx2" in flags, "avx512f": "avx512f" in flags,
               "avx512_bf16": "avx512_bf16" in flags,
               "amx": bool({"amx_tile", "amx_bf16"} & flags)}
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return {"cpu": cpu, "cores": cores, "tag": host_tag(cpu, cores, present),
            "flags": present, "python": platform.python_version(),
            "platform": platform.platform()}


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command that ran the benchmark, e.g. `python benchmarks/decode.py --runs 5`.

    Args:
      argv: the arguments after the script (what `main(argv)` parsed); None
        takes them from `sys.argv`.
    """
    script = sys.argv[0] if sys.argv and sys.argv[0] else "?"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isabs(script) and script.startswith(repo + os.sep):
        script = os.path.relpath(script, repo)
    args = list(sys.argv[1:] if argv is None else argv)
    return shlex.join(["python", script] + [str(a) for a in args])


def stage_outputs(root: str) -> Dict[str, Dict[str, str]]:
    """The output folders of each stage of the last run in `root` (its `run_summary.json`)."""
    with open(os.path.join(root, "run_summary.json")) as f:
        stages = json.load(f)["stages"]
    return {stage: dict(info.get("outputs") or {}) for stage, info in stages.items()}


def artifact_properties(uri: str) -> Dict[str, Any]:
    """The `properties` of the artifact in folder `uri` (its `artifact.json`)."""
    with open(os.path.join(uri, "artifact.json")) as f:
        return json.load(f)["properties"]


def results_dir() -> Optional[str]:
    """The folder results go to; None under pytest unless `BENCHMARK_RESULTS_DIR` is set."""
    chosen = os.environ.get(ENV_DIR)
    if chosen:
        return chosen
    if "PYTEST_CURRENT_TEST" in os.environ:
        return None
    return RESULTS_DIR


def write_result(benchmark: str, figures: Mapping[str, Any], *,
                 argv: Optional[Sequence[str]] = None, variant: str = "",
                 directory: Optional[str] = None) -> Optional[str]:
    """Writes one run's figures with its host, date and command line.

    Args:
      benchmark: the script's name without `.py` (`decode`, `preprocess`).
      figures: what the script measured, JSON-serializable (the dict it
        prints as its last line).
      argv: the arguments `main(argv)` parsed; None takes `sys.argv[1:]`.
        Pass it where `main` is called with a list, so the recorded command
        is the one that ran.
      variant: appended to the benchmark's name in the file name, to keep
        runs of different modes on one day apart (`mixed_bfloat16`).
      directory: where to write; None uses `results_dir()`.
    Returns:
      The path written, or None where nothing was written (under pytest).
    """
    directory = directory or results_dir()
    if directory is None:
        return None
    now = datetime.datetime.now(datetime.timezone.utc)
    machine = host()
    name = f"{benchmark}-{variant}" if variant else benchmark
    path = os.path.join(directory, f"{name}-{now:%Y-%m-%d}-{machine['tag']}.json")
    record = {"benchmark": name, "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "host": machine,
              "command": command_line(argv), "figures": figures}
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True, default=str)
        f.write("\n")
    os.replace(tmp, path)
    print(f"results: {path}", file=sys.stderr, flush=True)
    return path
