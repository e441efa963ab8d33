"""What `vit audit` writes: summary.json, duplicates.csv, label_issues.csv and report.html.

report.html is one self-contained file: charts and thumbnails are embedded as ``data:`` PNGs, the style
is inline, and there is no script and no external URL, so it reads offline and can be mailed. Every name
that comes from the user's disk (paths, class names, problems) is HTML-escaped where it enters the page.
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

from vit.files import save_atomic

DUPLICATE_COLUMNS = ("path_a", "split_a", "path_b", "split_b", "kind", "distance", "score", "needed")
LABEL_COLUMNS = ("path", "split", "given", "suggested", "score")
STYLE = """
body{font-family:sans-serif;margin:1.5em;max-width:1200px;color:#222}
h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.2em .5em;text-align:left}
.grid{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #ccc;padding:6px;font-size:12px;width:260px;
overflow-wrap:anywhere}.pair{display:flex;gap:4px}.card img{width:120px;height:120px;object-fit:contain;
image-rendering:pixelated;background:#eee}.summary{font-size:1.1em;background:#f6f6f0;padding:.8em}
.note{color:#555;font-size:.9em}p>img{max-width:100%;height:auto}
"""


def e(value: Any) -> str:
    """``value`` as text that is safe inside HTML elements and quoted attributes."""
    return html.escape(str(value), quote=True)


def data_uri(png: bytes) -> str:
    """PNG bytes as a ``data:`` URI."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def thumbnail_png(img: Image.Image, side: int = 120) -> bytes:
    """A PNG thumbnail of at most ``side`` pixels a side (small images are enlarged by the page, not here)."""
    img = img.convert("RGB") if img.mode not in ("RGB", "L") else img.copy()
    img.thumbnail((side, side))
    buffer = io.BytesIO()
    img.save(buffer, format="PNG")
    return buffer.getvalue()


def write_csv(path: str | os.PathLike, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> Path:
    """A CSV file of ``rows`` (only ``columns``), written atomically."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    data = text.getvalue().encode()
    return save_atomic(lambda f: f.write(data), path)


def write_json(path: str | os.PathLike, value: Any) -> Path:
    """A JSON file, indented, written atomically."""
    data = json.dumps(value, indent=2, default=str).encode()
    return save_atomic(lambda f: f.write(data), path)


def summary_sentences(summary: dict[str, Any]) -> list[str]:
    """The findings in a few sentences, worst first, e.g. "27 test images have a near-copy in train"."""
    said = []
    plural = lambda n, one, many: f"{n} {one if n == 1 else many}"
    labels = summary.get("label_issues") or {}
    if labels.get("trusted") is False:
        said.append(f"label check not trusted: {labels['verdict']}")
    for split, found in summary["leakage"].items():
        for other, kinds in found.items():
            for kind, n in kinds.items():
                if n:
                    article = "an" if kind == "exact" else "a"
                    said.append(f"{n} {split} image{'s have' if n != 1 else ' has'} {article} {kind} copy in {other}")
    if summary["inventory"]["bad_files"]:
        said.append(plural(len(summary["inventory"]["bad_files"]), "file cannot", "files cannot") + " be read")
    if summary.get("bad_rows"):
        kinds = Counter(r["kind"] for r in summary["bad_rows"])
        said.append(plural(len(summary["bad_rows"]), "row", "rows") + " of the labels table left out ("
                    + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common()) + "; lines in summary.json)")
    if summary["label_conflicts"]:
        said.append(plural(summary["label_conflicts"], "pair of identical images carries",
                           "pairs of identical images carry") + " different labels")
    if labels.get("skipped"):
        said.append(f"label check skipped: {labels['skipped']}")
    elif labels.get("trusted") and labels.get("flagged") is not None:
        said.append(plural(labels["flagged"], "training label looks", "training labels look") + " wrong")
    for small in summary["inventory"]["small_classes"]:
        said.append(f"class {small['class']!r} has {small['images']} training images (the largest has "
                    f"{small['largest']})")
    within = summary["duplicates"]["within_split"]
    if within:
        said.append(plural(within, "duplicate pair lies", "duplicate pairs lie") + " within a split")
    return said or ["nothing found"]


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _figure(png: bytes, alt: str) -> str:
    return f'<p><img alt="{e(alt)}" src="{data_uri(png)}"></p>'


def render_html(summary: dict[str, Any], charts: dict[str, bytes], pairs: Sequence[dict[str, Any]],
                issues: Sequence[dict[str, Any]], thumbnail: Callable[[Any], bytes], *, shown: int = 60) -> str:
    """The report page. ``pairs`` and ``issues`` are the CSV rows (with ``_a``/``_b``/``_record`` entries that
    ``thumbnail`` turns into PNG bytes); the first ``shown`` of each are drawn."""
    inv = summary["inventory"]
    img = lambda record: f'<img alt="{e(record.name)}" src="{data_uri(thumbnail(record))}">'
    parts = [f"<h1>vit audit: {e(summary['data'])}</h1>",
             '<section id="summary"><p class="summary">' + e("; ".join(summary_sentences(summary))) + ".</p>",
             f'<p class="note">{inv["images"]} images in {len(inv["classes"])} classes; '
             + e(", ".join(f"{n} {s}" for s, n in inv["images_per_split"].items())) + "</p></section>",
             _inventory_section(inv, charts), _bad_files_section(inv["bad_files"]),
             _duplicates_section(summary["duplicates"], pairs, img, shown),
             _label_issues_section(summary.get("label_issues") or {}, issues, img, shown)]
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>vit audit</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")


def _inventory_section(inv: dict[str, Any], charts: dict[str, bytes]) -> str:
    parts = ['<section id="inventory"><h2>Inventory</h2>', _figure(charts["classes"], "images per class and split")]
    if inv["small_classes"]:
        parts.append("<p>Classes under 10% of the largest class's training images:</p>"
                     + _table(["class", "training images", "largest class"],
                              [(s["class"], s["images"], s["largest"]) for s in inv["small_classes"]]))
    parts.append(_table(["width", "height", "images"], [(s["width"], s["height"], s["images"])
                                                          for s in inv["sizes"][:15]]))
    if "aspect" in charts:
        parts.append(_figure(charts["aspect"], "aspect ratios"))
    parts.append(_table(["mode", "images"], list(inv["modes"].items()))
                 + _table(["format", "images"], list(inv["formats"].items())) + "</section>")
    return "".join(parts)


def _bad_files_section(bad_files: Sequence[dict[str, Any]]) -> str:
    listed = (_table(["path", "split", "problem"], [(b["path"], b["split"], b["problem"]) for b in bad_files])
              if bad_files else "<p>None: every file's header reads and every image decodes.</p>")
    return f'<section id="bad-files"><h2>Bad files ({len(bad_files)})</h2>{listed}</section>'


def _duplicates_section(dup: dict[str, Any], pairs: Sequence[dict[str, Any]], img: Callable[[Any], str],
                        shown: int) -> str:
    cross = [p for p in pairs if p["split_a"] != p["split_b"]]
    parts = [f'<section id="duplicates"><h2>Duplicates across splits ({len(cross)} pairs)</h2>'
             f'<p class="note">{dup["exact"]} exact pairs (same decoded pixels) and {dup["near"]} near pairs: '
             f'{dup["candidates"]} candidates (pHash, or a zoomed window\'s, within {dup["radius"]} of 64 bits), '
             f'kept where the aligned colour correlation reaches what an edited copy of the two images would '
             f'(and at least {dup["min_score"]}), and no other candidate of either is closer; '
             f'{dup["within_split"]} '
             "pairs lie within a split (see duplicates.csv).</p><div class=\"grid\">"]
    card = lambda p: (f'<div class="card"><div class="pair">{img(p["_a"])}{img(p["_b"])}</div>'
                      f'{e(p["kind"])}, hash distance {e(p["distance"])}, score {e(p["score"])}'
                      f' (needed {e(p["needed"])})'
                      f'<br>{e(p["split_a"])}: {e(p["path_a"])} '
                      f'({e(p["label_a"])})<br>{e(p["split_b"])}: {e(p["path_b"])} ({e(p["label_b"])})</div>')
    parts += [card(p) for p in cross[:shown]]
    conflicts = [p for p in pairs if p["kind"] == "exact" and p["label_a"] != p["label_b"]]
    parts.append(f'</div><h3>Identical images with different labels ({len(conflicts)})</h3><div class="grid">')
    parts += [card(p) for p in conflicts[:shown]]
    parts.append("</div></section>")
    return "".join(parts)


def _label_issues_section(labels: dict[str, Any], issues: Sequence[dict[str, Any]], img: Callable[[Any], str],
                          shown: int) -> str:
    parts = [f'<section id="label-issues"><h2>Suspected label issues ({labels.get("flagged") or 0})</h2>']
    if labels.get("skipped") or labels.get("trusted") is False:
        parts.append(f'<p class="summary">{e(labels.get("skipped") or labels["verdict"])}</p>')
    parts.append(f'<p class="note">{e(labels.get("note", ""))}</p><div class="grid">')
    for issue in issues[:shown]:
        parts.append(f'<div class="card">{img(issue["_record"])}<br>given <b>{e(issue["given"])}</b>, suggested '
                     f'<b>{e(issue["suggested"])}</b>, score {issue["score"]:.3g}<br>{e(issue["path"])}</div>')
    parts.append("</div></section>")
    return "".join(parts)
