"""A self-contained HTML page: inline CSS, figures inlined as base64 PNG (or linked), no network access.

A small script marks <body data-images="loaded/total" data-height="px"> after load so headless browsers (and tests)
can check that every figure decoded and size a full-page screenshot (`screenshot`).
"""
from __future__ import annotations

import base64
import html
import os
import re
import shutil
import subprocess
import tempfile
from typing import Iterable, List, Optional, Sequence

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;max-width:1500px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}th{background:#f3f3f3}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.wrap{max-width:26em;overflow-wrap:anywhere;word-break:break-word}
.scroll{overflow-x:auto;max-width:100%}
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
  document.body.setAttribute('data-height', String(document.documentElement.scrollHeight));
});
"""


def esc(x) -> str:
    return html.escape("" if x is None else str(x))


def table(headers: Sequence[str], rows: Iterable[Sequence], numeric: Sequence[int] = (),
          wrap: Sequence[int] = ()) -> str:
    """numeric columns are right-aligned and never wrap; `wrap` columns (configs, point names: long strings without
    spaces) break anywhere within a bounded width and carry their full text as a tooltip, so they cannot push the
    numbers off screen."""
    out = ["<div class='scroll'><table><tr>" + "".join("<th>{}</th>".format(esc(h)) for h in headers) + "</tr>"]
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            if i in numeric:
                cells.append('<td class="num">{}</td>'.format(esc(c)))
            elif i in wrap:
                cells.append('<td class="wrap" title="{}">{}</td>'.format(esc(c), _breakable(c)))
            else:
                cells.append("<td>{}</td>".format(esc(c)))
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _breakable(x) -> str:
    """Escaped text with break opportunities after the separators of point names and configs (/ , _ =), so a
    wrapped cell breaks between fields rather than inside a number."""
    out = esc(x)
    for sep in ("/", ",", "_"):
        out = out.replace(sep, sep + "<wbr>")
    return out


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


def find_chromium() -> Optional[str]:
    for c in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(c):
            return shutil.which(c)
    return None


MAX_SCREENSHOT_HEIGHT = 16000  # Chromium's compositor refuses taller surfaces


def screenshot(html_path: str, png_path: str, width: int = 1400, chromium: Optional[str] = None) -> dict:
    """A full-page PNG of a page written by `render`, through headless Chromium: a first pass reads the page's
    height and decoded-image count from the body's data attributes, the second captures at that height (capped at
    MAX_SCREENSHOT_HEIGHT). Returns {"images": "loaded/total", "height": px, "truncated": bool}. Raises RuntimeError
    (one line) when Chromium is missing or fails."""
    chrome = chromium or find_chromium()
    if not chrome:
        raise RuntimeError("chromium not found; install it (apt-get install -y chromium) to take screenshots")
    url = "file://" + os.path.abspath(html_path)
    with tempfile.TemporaryDirectory(prefix="fb-chromium-") as prof:
        flags = [chrome, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                 "--user-data-dir=" + prof, "--virtual-time-budget=10000", "--force-device-scale-factor=1"]
        dom = subprocess.run(flags + ["--window-size={},1000".format(width), "--dump-dom", url],
                             capture_output=True, text=True, timeout=120)
        m = re.search(r'data-images="(\d+/\d+)"', dom.stdout)
        h = re.search(r'data-height="(\d+)"', dom.stdout)
        if not m or not h:
            raise RuntimeError("chromium did not run the page's load script on {} (exit {}): {}".format(
                html_path, dom.returncode, (dom.stderr or dom.stdout).strip().splitlines()[-1:] or ""))
        height = int(h.group(1))
        shot_h = min(height + 16, MAX_SCREENSHOT_HEIGHT)
        os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
        r = subprocess.run(flags + ["--window-size={},{}".format(width, shot_h), "--screenshot=" + os.path.abspath(
            png_path), url], capture_output=True, text=True, timeout=180)
        if r.returncode != 0 or not os.path.exists(png_path):
            raise RuntimeError("chromium could not screenshot {} (exit {})".format(html_path, r.returncode))
    return {"images": m.group(1), "height": height, "truncated": height + 16 > MAX_SCREENSHOT_HEIGHT}
