"""The records of `benchmarks/results/` as `benchmarks/report.py` reads them, and its cell formatting.

A `Record` is one JSON file `benchmarks/results.py` wrote
(`<benchmark>[-<variant>]-<UTC date>-<host tag>.json`); its stem is the file
name without the date and host tag, one benchmark and variant. A `Context`
hands the tables the newest record of a stem and remembers what they read,
for the `superseded` table. Importing this module imports neither
TensorFlow nor numpy.
"""
from __future__ import annotations

import glob
import json
import os
import re
from typing import Any, Dict, Iterable, List, Sequence, Tuple

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

_FILE_RE = re.compile(r"^(?P<stem>.+)-(?P<date>\d{4}-\d{2}-\d{2})-(?P<tag>[a-z0-9-]+)\.json$")

# Records replaced by a run of another benchmark or variant name: file -> (what of it, replacing file).
RETIRED: Dict[str, Tuple[str, str]] = {
    "serving-2026-11-25-intel-xeon-2c-avx512.json":
        ("fixture model, TensorFlow's pools", "serving-default-2026-11-27-amd-epyc-2c-bf16.json"),
    "serving-overhead-2026-11-27-amd-epyc-2c-bf16.json":
        ("demo export, TensorFlow's pools", "serving-overhead-threads-tf2-2026-11-27-amd-epyc-2c-bf16.json"),
    "serving-overhead-intra1-2026-11-27-amd-epyc-2c-bf16.json":
        ("demo export, one intra-op thread", "serving-overhead-threads-auto2-2026-11-27-amd-epyc-2c-bf16.json"),
    "serving-overhead-float32-2026-11-27-amd-epyc-2c-bf16.json":
        ("2-epoch float32 demo export", "serving-overhead-float32-after-2026-11-27-amd-epyc-2c-bf16.json"),
    "train_step-2026-11-26-intel-xeon-2c-avx512.json":
        ("float32", "train_step-soft-additive-float32-2026-11-27-amd-epyc-2c-bf16.json"),
    "serving-overhead-2026-11-26-amd-epyc-2c-bf16.json":
        ("fixture model, REST", "serving-default-2026-11-27-amd-epyc-2c-bf16.json"),
    "train_step-2026-11-26-amd-epyc-2c-bf16.json":
        ("`auto` and `--precision float32` runs; its `--baseline-precision float32` run is shown",
         "train_step-soft-additive-mixed_bfloat16-2026-11-27-amd-epyc-2c-bf16.json"),
}


# ---------------------------------------------------------------------------
# Records


class Record:
    """One JSON file of `benchmarks/results/`."""

    def __init__(self, path: str, data: Dict[str, Any]):
        self.path = path
        self.file = os.path.basename(path)
        match = _FILE_RE.match(self.file)
        self.stem = match.group("stem") if match else self.file[:-len(".json")]
        self.data = data
        self.figures: Dict[str, Any] = data.get("figures", {})
        self.host: Dict[str, Any] = data.get("host", {})
        self.date = str(data.get("date", match.group("date") if match else ""))[:10]
        self.command = str(data.get("command", ""))

    @property
    def order(self) -> Tuple[str, str]:
        """Sorts runs oldest first: the recorded date (with its time where there is one)."""
        return (str(self.data.get("date", self.date)), self.file)

    @property
    def tag(self) -> str:
        return str(self.host.get("tag", ""))


def load_records(directory: str = RESULTS_DIR) -> Dict[str, Record]:
    """Every record of `directory`, by file name."""
    records = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        with open(path, encoding="utf-8") as f:
            records[os.path.basename(path)] = Record(path, json.load(f))
    return records


def cpu_name(host: Dict[str, Any]) -> str:
    """`AMD EPYC`, `Intel Xeon @ 2.80GHz (Ice Lake server, ...)`: the CPU without trademarks."""
    return re.sub(r"\s+", " ", re.sub(r"\((R|TM)\)|\bProcessor\b", "", str(host.get("cpu", "?")))).strip()


def short_cpu(host: Dict[str, Any]) -> str:
    """The CPU's name as the tables give it: `AMD EPYC`, `Intel Xeon (Ice Lake)`."""
    name = cpu_name(host)
    lake = re.search(r"\((\w+ Lake)", name)
    name = re.sub(r"\s*@.*$|\s*\(.*$", "", name)
    return f"{name} ({lake.group(1)})" if lake else name


def where(record: Record) -> str:
    """`AMD EPYC, 2026-11-27`: a record's host and date."""
    return f"{short_cpu(record.host)}, {record.date}"


class Context:
    """The records, and which of them the tables read (for the `superseded` table)."""

    def __init__(self, records: Dict[str, Record]):
        self.records = records
        self.by_stem: Dict[str, List[Record]] = {}
        for record in records.values():
            self.by_stem.setdefault(record.stem, []).append(record)
        for runs in self.by_stem.values():
            runs.sort(key=lambda r: r.order)
        self.latest_stems: set = set()
        self.read: Dict[str, Record] = {}

    def latest(self, stem: str) -> Record:
        """The newest record of one benchmark and variant (`decode`, `decode-general`)."""
        if stem not in self.by_stem:
            raise KeyError(f"no record of {stem!r} in benchmarks/results/")
        self.latest_stems.add(stem)
        record = self.by_stem[stem][-1]
        self.read[record.file] = record
        return record

    def file(self, name: str) -> Record:
        """One record by its file name."""
        if name not in self.records:
            raise KeyError(f"no {name} in benchmarks/results/")
        self.read[name] = self.records[name]
        return self.records[name]

    def superseded(self) -> List[Tuple[Record, str, str]]:
        """(record, what of it, replacing file) for every record the tables no longer show.

        The older records of each benchmark and variant a table read, the
        records `RETIRED` names, and the other records of their benchmark and
        variant that no table read.
        """
        def replacement(record: Record) -> str:
            return RETIRED[record.file][1] if record.file in RETIRED else record.file
        stems = self.latest_stems | {self.records[name].stem for name in RETIRED if name in self.records}
        rows = []
        for stem in stems:
            runs = self.by_stem[stem]
            for old in runs:
                if old.file in RETIRED:
                    rows.append((old, *RETIRED[old.file]))
                elif old.file not in self.read:
                    rows.append((old, "", replacement(runs[-1])))
        return sorted(rows, key=lambda row: row[0].order)


# ---------------------------------------------------------------------------
# Formatting


def cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def num(value: Any, digits: int = 3) -> str:
    """A figure as the tables print it; blank where the record has none."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)):
        if isinstance(value, int) or float(value).is_integer() and digits == 0:
            return f"{value:,}" if abs(value) >= 10000 else str(int(value))
        return f"{value:.{digits}f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(num(v, digits) for v in value)
    return str(value)


def span(values: Sequence[float], digits: int = 2) -> str:
    """`1.04-1.09`: the lowest and highest of several figures."""
    low, high = num(min(values), digits), num(max(values), digits)
    return low if low == high else f"{low}-{high}"


def pct(new: float, old: float) -> str:
    return f"{(new - old) / old * 100:+.1f}%"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> List[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines


def provenance(records: Sequence[Record], commands: bool = True) -> str:
    """`Records: `file` (AMD EPYC, 2026-11-27: `command`); ...`; without `commands`, the files only."""
    if not commands:
        return ("Records: " + ", ".join(f"`{r.file}`" for r in records)
                + " in `benchmarks/results/` (their commands: [docs/PERFORMANCE.md](docs/PERFORMANCE.md)).")
    parts = []
    for record in records:
        command = record.command.replace("`", "'")
        note = "; transcribed from the docs" if record.data.get("source") else ""
        parts.append(f"`{record.file}` ({short_cpu(record.host)}, {record.date}: `{command}`{note})")
    return "Records: " + "; ".join(parts) + "."


METRICS = {"Bleu_1": "Bleu_1", "Bleu_4": "Bleu_4", "METEOR": "METEOR", "ROUGE_L": "ROUGE_L",
           "CIDEr": "CIDEr", "attribute_accuracy": "attribute", "relation_accuracy": "relation",
           "grounding": "grounding", "grounding_noun": "grounding_noun"}


def metric(metrics: Dict[str, Any], key: str) -> str:
    """A caption metric: 3 decimals, CIDEr 2 from 2.0 up (the demo's 6.97, scenes' 0.815)."""
    value = metrics.get(key)
    return num(value, 2 if key == "CIDEr" and value is not None and value >= 2 else 3)


# A table's renderer takes the Context and returns (its lines, the records it read).
Rendered = Tuple[List[str], List[Record]]


def t_hosts(ctx: Context) -> Rendered:
    """The hosts of the records the other tables read or list (render it after them)."""
    hosts: Dict[str, Tuple[Dict[str, Any], List[str]]] = {}
    shown = {**ctx.read, **{old.file: old for old, _, _ in ctx.superseded()}}
    for record in shown.values():
        if record.tag:
            hosts.setdefault(record.tag, (record.host, []))[1].append(record.date)
    rows = []
    for tag, (host, dates) in sorted(hosts.items()):
        flags = host.get("flags", {})
        have = ", ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx") if flags.get(f)) or "none"
        lacks = ", ".join(f for f in ("avx512_bf16", "amx") if not flags.get(f))
        auto = "bfloat16" if flags.get("avx512_bf16") or flags.get("amx") else "float32"
        rows.append([f"`{tag}`", cpu_name(host), host.get("cores", ""), have + (f" (no {lacks})" if lacks else ""),
                     auto, f"{min(dates)} to {max(dates)}", len(dates)])
    lines = table(["host tag", "CPU (`/proc/cpuinfo`)", "cores", "flags that matter", "`auto` trains in",
                   "record dates", "records"], rows)
    return lines + ["", "Records: those the tables of these docs show or list, by their `host` field."], []


def t_superseded(ctx: Context) -> Rendered:
    rows = [[f"`{old.file}`" + (f" ({what})" if what else ""), old.date, short_cpu(old.host),
             f"`{by}`"] for old, what, by in ctx.superseded()]
    return table(["record", "date", "host", "replaced by"], rows), []
