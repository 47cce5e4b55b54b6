"""A self-contained HTML page: inline CSS, figures inlined as base64 PNG (or linked), no network access.

A small script marks <body data-images="loaded/total"> after load so headless browsers (and tests) can
check that every figure decoded.
"""
from __future__ import annotations

import base64
import html
import os
from typing import Iterable, List, Optional, Sequence

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:12px 0}figcaption{font-size:13px;color:#555;max-width:1100px}
img{max-width:100%;border:1px solid #eee}
.bad{color:#b00020}.good{color:#137333}.muted{color:#777}
code{background:#f5f5f5;padding:0 3px}
"""

SCRIPT = """
window.addEventListener('load', function () {
  var imgs = document.images, ok = 0;
  for (var i = 0; i < imgs.length; i++) if (imgs[i].complete && imgs[i].naturalWidth > 0) ok++;
  document.body.setAttribute('data-images', ok + '/' + imgs.length);
});
"""


def esc(x) -> str:
    return html.escape("" if x is None else str(x))


def table(headers: Sequence[str], rows: Iterable[Sequence], numeric: Sequence[int] = ()) -> str:
    out = ["<table><tr>" + "".join("<th>{}</th>".format(esc(h)) for h in headers) + "</tr>"]
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            cls = ' class="num"' if i in numeric else ""
            cells.append("<td{}>{}</td>".format(cls, esc(c)))
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


def figure(png_path: str, caption: str, embed: bool, out_dir: str) -> str:
    if embed:
        with open(png_path, "rb") as f:
            src = "data:image/png;base64," + base64.b64encode(f.read()).decode("ascii")
    else:
        src = os.path.relpath(png_path, out_dir)
    return '<figure><img src="{}" alt="{}"><figcaption>{}</figcaption></figure>'.format(
        esc(src), esc(os.path.basename(png_path)), esc(caption))


def omitted_list(omitted: List[tuple]) -> str:
    if not omitted:
        return "<p class='muted'>Every figure had the data it needs.</p>"
    return "<ul>" + "".join("<li><b>{}</b>: {}</li>".format(esc(t), esc(w)) for t, w in omitted) + "</ul>"


def render(title: str, body: List[str], subtitle: Optional[str] = None) -> str:
    return "\n".join([
        "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
        "<title>{}</title>".format(esc(title)), "<style>{}</style>".format(CSS),
        "<script>{}</script>".format(SCRIPT), "</head><body data-images='pending'>",
        "<h1>{}</h1>".format(esc(title)),
        "<p class='muted'>{}</p>".format(esc(subtitle)) if subtitle else "",
    ] + body + ["</body></html>"])
