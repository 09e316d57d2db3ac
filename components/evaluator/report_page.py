"""The Evaluation as one self-contained HTML page: `report.html` in the Evaluation folder.

Everything the Evaluator decided, readable offline and mailable as one file:
the verdict and its reasons, the caption metrics (candidate, and baseline
where there is one), the candidate vs baseline comparison with its bootstrap
intervals and thresholds, the grounding metrics, the end-of-caption check
with examples of dangling captions, the notes, and the attention figures
embedded as `data:` URIs. No scripts, no external stylesheet, font or image:
the page loads nothing.

`write_report(evaluation_dir, blessing)` reads what the Evaluator wrote into
the folder (`metrics.json`, `captions.jsonl`, `figures/*.png`), so it can
also be run on an older Evaluation.
"""
from __future__ import annotations

import base64
import html
import json
import os
from typing import Iterable, Mapping, Optional, Sequence

from components.contract.config import CAPTION_METRICS, GROUNDING_METRICS, REPORTED_METRICS
from components.evaluator.metrics.endings import is_dangling

REPORT_FILE = "report.html"
MAX_DANGLING_EXAMPLES = 12
DESCRIPTIONS = {
    "Bleu_1": "unigram precision with a brevity penalty (coco-caption)",
    "Bleu_2": "bigram precision with a brevity penalty (coco-caption)",
    "Bleu_3": "trigram precision with a brevity penalty (coco-caption)",
    "Bleu_4": "4-gram precision with a brevity penalty (coco-caption)",
    "METEOR": "unigram matches with stems and synonyms (needs Java)",
    "ROUGE_L": "longest common subsequence F-measure",
    "CIDEr": "TF-IDF weighted n-gram agreement with the references",
    "attribute_accuracy": "captions naming exactly the image's (colour, shape) objects",
    "relation_accuracy": "spatial relations (above, left of, ...) that hold in the image",
    "size_accuracy": "sizes named (small, large) that match the named object's",
    "grounding": "attention mass inside the named object's box, per word",
    "grounding_noun": "attention mass inside the box at the object's noun",
    "dangling_ending_rate": "captions ending on a function word (lower is better)",
    "dangling_endings": "how many captions end on a function word",
    "empty_captions": "captions with no words",
}
_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
 margin:0 auto;max-width:1100px;padding:16px;color:#1b1d21;line-height:1.4}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #c9ced6}
table{border-collapse:collapse;margin:8px 0}th,td{padding:4px 10px;text-align:left;
 border-bottom:1px solid #e2e5ea;vertical-align:top}td.num{text-align:right;
 font-variant-numeric:tabular-nums}th{background:#f3f5f8}
.verdict{display:inline-block;padding:4px 12px;border-radius:4px;font-weight:700}
.blessed{background:#e3f4e6;color:#17602a}.refused{background:#fdecec;color:#a1151a}
.pass{color:#17602a}.fail{color:#a1151a;font-weight:700}.muted{color:#5b616b}
figure{margin:16px 0;padding-bottom:12px;border-bottom:1px solid #e2e5ea}
figure img{max-width:100%;height:auto}figcaption{font-weight:600}
@media (max-width:640px){body{padding:8px}table{font-size:.9rem}}
"""


def write_report(evaluation_dir: str, blessing: Optional[Mapping] = None,
                 title: str = "Evaluation") -> str:
    """Writes `evaluation_dir/report.html` from the files the Evaluator wrote there.

    Args:
      evaluation_dir: the Evaluation folder (`metrics.json`, `captions.jsonl`,
        `figures/`).
      blessing: the Blessing's properties (`blessed`, `reasons`, `decoding`,
        `export_digest`, `bootstrap`, `baseline`), or None.
      title: the page title.
    Returns:
      The path written (atomically: a reader never sees half a page).
    """
    with open(os.path.join(evaluation_dir, "metrics.json"), encoding="utf-8") as f:
        recorded = json.load(f)
    captions = _read_captions(os.path.join(evaluation_dir, "captions.jsonl"))
    page = render_report(recorded, blessing or {}, captions,
                         _figures(os.path.join(evaluation_dir, "figures"), captions), title)
    path = os.path.join(evaluation_dir, REPORT_FILE)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, path)
    return path


def render_report(recorded: Mapping, blessing: Mapping, captions: Sequence[Mapping],
                  figures: Sequence[Mapping], title: str = "Evaluation") -> str:
    """The page's HTML.

    Args:
      recorded: `metrics.json` (`metrics`, `notes`, `baseline_metrics`, `comparison`).
      blessing: the Blessing's properties (may be empty).
      captions: `captions.jsonl` rows (`image_id`, `caption`, `references`).
      figures: `image_id`, `caption`, `references`, `png` (the PNG's bytes).
      title: the page title.
    """
    metrics = recorded.get("metrics") or {}
    baseline = recorded.get("baseline_metrics") or None
    comparison = recorded.get("comparison") or blessing.get("comparison") or []
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_esc(title)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>{_esc(title)}</h1>"]
    parts += _summary(metrics, blessing)
    parts += _metric_table("Caption metrics", CAPTION_METRICS, metrics, baseline)
    parts += _comparison(comparison, blessing)
    grounded = [k for k in GROUNDING_METRICS if metrics.get(k) is not None]
    if grounded:
        parts += _metric_table("Grounding", grounded, metrics, baseline,
                               "Where the attention and the words agree with the objects' "
                               "boxes (data with object boxes only).")
    parts += _endings(metrics, baseline, captions)
    notes = recorded.get("notes") or []
    if notes:
        parts += ["<h2>Notes</h2><ul>"] + [f"<li>{_esc(n)}</li>" for n in notes] + ["</ul>"]
    parts += _figure_section(figures)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _esc(value) -> str:
    return html.escape(str(value), quote=True)


def _num(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _esc(value)
    return str(value) if isinstance(value, int) else f"{value:.{digits}f}"


def _summary(metrics: Mapping, blessing: Mapping) -> list:
    parts = []
    if "blessed" in blessing:
        blessed = bool(blessing["blessed"])
        parts.append(f'<p><span class="verdict {"blessed" if blessed else "refused"}">'
                     f'{"BLESSED" if blessed else "NOT BLESSED"}</span></p>')
        reasons = blessing.get("reasons") or []
        if reasons:
            parts += ["<ul>"] + [f"<li>{_esc(r)}</li>" for r in reasons] + ["</ul>"]
    facts = []
    decoding = blessing.get("decoding") or {}
    if decoding:
        beam = decoding.get("beam_size")
        facts.append(("decoding", f"beam size {beam}" + (" (greedy)" if beam == 1 else "")
                      + f", max length {decoding.get('max_length')}, length normalization "
                      f"{decoding.get('length_normalization')}"))
    for key, label in (("num_test_images", "test images"), ("failed_images", "refused images"),
                       ("decode_seconds", "seconds in serving_default")):
        if key in metrics:
            facts.append((label, _num(metrics[key], 2)))
    if blessing.get("export_digest"):
        facts.append(("SavedModel digest", str(blessing["export_digest"])[:16]))
    base = blessing.get("baseline") or {}
    facts.append(("baseline", base.get("serving_model_uri") or "none (first push)"))
    parts.append("<table>")
    parts += [f"<tr><th>{_esc(k)}</th><td>{_esc(v)}</td></tr>" for k, v in facts]
    parts.append("</table>")
    return parts


def _metric_table(heading: str, names: Iterable[str], metrics: Mapping,
                  baseline: Optional[Mapping], intro: str = "") -> list:
    names = [n for n in names if n in metrics or (baseline and n in baseline)]
    if not names:
        return []
    parts = [f"<h2>{_esc(heading)}</h2>"] + ([f"<p>{_esc(intro)}</p>"] if intro else [])
    head = "<tr><th>metric</th><th>candidate</th>" + \
        ("<th>baseline</th>" if baseline else "") + "<th>meaning</th></tr>"
    parts += ["<table>", head]
    for name in names:
        cells = [f"<td>{_esc(name)}</td>", f'<td class="num">{_num(metrics.get(name))}</td>']
        if baseline:
            cells.append(f'<td class="num">{_num(baseline.get(name))}</td>')
        cells.append(f'<td class="muted">{_esc(DESCRIPTIONS.get(name, ""))}</td>')
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    return parts


def _interval(row: Mapping) -> str:
    bits = []
    if row.get("interval") is not None:
        lo, hi = row["interval"]
        bits.append(f"[{_num(lo)}, {_num(hi)}]")
    threshold = row.get("change_threshold") or {}
    if row.get("relative_interval") is not None and "relative" in threshold:
        lo, hi = row["relative_interval"]
        bits.append(f"relative [{_num(lo)}, {_num(hi)}]")
    return " ".join(bits) or "-"


def _threshold(row: Mapping) -> str:
    bits = [] if row.get("minimum") is None else [f"&ge; {_esc(row['minimum'])}"]
    for kind, bound in sorted((row.get("change_threshold") or {}).items()):
        label = "change" if kind == "absolute" else "relative change"
        bits.append(f"{label} &ge; {_esc(bound)}")
    return ", ".join(bits) or "-"


def _comparison(rows: Sequence[Mapping], blessing: Mapping) -> list:
    if not rows:
        return []
    bootstrap = blessing.get("bootstrap") or {}
    intro = ("Candidate and baseline captioned the same test images in the same run with the "
             "same decoding; the interval is the paired bootstrap's "
             f"{_num(100 * bootstrap.get('confidence', 0.95), 0)}% interval of the difference"
             + (f" ({bootstrap['resamples']} resamples)" if bootstrap.get("resamples") else "")
             + ". A metric refuses the push only when it is worse beyond its threshold.")
    parts = ["<h2>Candidate vs baseline</h2>", f"<p>{_esc(intro)}</p>", "<table>",
             "<tr><th>metric</th><th>candidate</th><th>baseline</th><th>difference</th>"
             "<th>interval</th><th>threshold</th><th>verdict</th></tr>"]
    for row in rows:
        verdict = str(row.get("verdict", ""))
        notes = "; ".join(row.get("notes") or [])
        css = "pass" if verdict == "pass" else "fail" if verdict == "fail" else "muted"
        parts.append(
            f"<tr><td>{_esc(row.get('metric'))}</td>"
            f'<td class="num">{_num(row.get("candidate"))}</td>'
            f'<td class="num">{_num(row.get("baseline"))}</td>'
            f'<td class="num">{_num(row.get("difference"))}</td>'
            f"<td>{_interval(row)}</td><td>{_threshold(row)}</td>"
            f'<td class="{css}">{_esc(verdict)}'
            + (f' <span class="muted">({_esc(notes)})</span>' if notes else "") + "</td></tr>")
    parts.append("</table>")
    return parts


def _endings(metrics: Mapping, baseline: Optional[Mapping], captions: Sequence[Mapping]) -> list:
    parts = _metric_table("Dangling endings", REPORTED_METRICS, metrics, baseline,
                          "Captions that stop on a function word (\"... with a\"): the "
                          "n-gram metrics barely penalize them. Reported, never a threshold.")
    dangling = [c for c in captions if c.get("caption") and is_dangling(c["caption"])]
    if not parts and not dangling:
        return []
    if not dangling:
        return parts + ["<p>No caption ends on a function word.</p>"]
    shown = dangling[:MAX_DANGLING_EXAMPLES]
    parts += [f"<p>{len(dangling)} of {len(captions)} captions; the first {len(shown)}:</p>",
              "<table><tr><th>image</th><th>caption</th><th>a reference</th></tr>"]
    for c in shown:
        reference = (c.get("references") or [""])[0]
        parts.append(f"<tr><td>{_esc(c.get('image_id'))}</td><td>{_esc(c['caption'])}</td>"
                     f'<td class="muted">{_esc(reference)}</td></tr>')
    parts.append("</table>")
    return parts


def _figure_section(figures: Sequence[Mapping]) -> list:
    if not figures:
        return []
    parts = ["<h2>Attention figures</h2>",
             "<p>The image, then each word with its attention map upsampled over it.</p>"]
    for fig in figures:
        data = base64.b64encode(fig["png"]).decode("ascii")
        parts.append(f"<figure><figcaption>{_esc(fig.get('image_id'))}: "
                     f"{_esc(fig.get('caption', ''))}</figcaption>")
        parts.append(f'<img src="data:image/png;base64,{data}" '
                     f'alt="{_esc(fig.get("caption", ""))}">')
        references = fig.get("references") or []
        if references:
            parts += ['<ol class="muted">'] + [f"<li>{_esc(r)}</li>" for r in references] + \
                ["</ol>"]
        parts.append("</figure>")
    return parts


def _read_captions(path: str) -> list:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _figures(figures_dir: str, captions: Sequence[Mapping]) -> list:
    """The figures' PNG bytes, by image id, with the caption and references recorded."""
    if not os.path.isdir(figures_dir):
        return []
    by_id = {c.get("image_id"): c for c in captions}
    out = []
    for name in sorted(os.listdir(figures_dir)):
        if not name.endswith(".png"):
            continue
        image_id = name[:-len(".png")]
        with open(os.path.join(figures_dir, name), "rb") as f:
            png = f.read()
        row = by_id.get(image_id, {})
        out.append({"image_id": image_id, "png": png, "caption": row.get("caption", ""),
                    "references": row.get("references") or []})
    return out


def report_of(output: Mapping) -> dict:
    """`{"report": path}` for an Evaluation artifact holding its page, else `{}` (inspect)."""
    path = os.path.join(str(output.get("uri", "")), REPORT_FILE)
    return {"report": path} if output.get("type") == "Evaluation" and os.path.isfile(path) else {}
