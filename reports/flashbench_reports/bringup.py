"""bringup: the same points on GPU A and GPU B, absolute and normalised by each GPU's measured ceilings.

parse (results.load) -> collect (matched points) -> plot -> render (DIR/index.html, DIR/bringup.md).
"""
from __future__ import annotations

import os
from typing import List, Optional

from . import figures as F
from . import page
from . import results as R
from .report import _fmt, device_rows


def _pct(t: Optional[float], peak: Optional[float]) -> Optional[float]:
    return None if t is None or peak is None else 100.0 * t / peak


def plot_pair(a: R.Results, b: R.Results, path: str, normalised: bool) -> str:
    pa, pb = a.ceiling("gemm_bf16_tflops"), b.ceiling("gemm_bf16_tflops")
    if normalised and (pa is None or pb is None):
        missing = [r.device_label for r, p in ((a, pa), (b, pb)) if p is None]
        raise F.Omitted("no measured bf16 GEMM ceiling in the file of {}; run 'flashbench probe'".format(
            " and ".join(missing)))
    fams = []
    for res in (a, b):
        try:
            fams.append(F._line_families(res.points))
        except F.Omitted:
            fams.append(({}, [], 0))
    shown = [f for f in fams[0][1] if f in fams[1][0]] or fams[0][1] or fams[1][1]
    if not shown:
        raise F.Omitted("neither file has a problem family with ok points at two or more sequence lengths")
    plt = F.plt()
    fig, axes = F._grid(len(shown))
    cmap = plt.get_cmap("tab10")
    for ax, fam in zip(axes, shown):
        variants = sorted(set(fams[0][0].get(fam, {})) | set(fams[1][0].get(fam, {})))
        for i, v in enumerate(variants):
            for res, fd, ls, peak in ((a, fams[0], "-", pa), (b, fams[1], "--", pb)):
                pts = sorted(fd[0].get(fam, {}).get(v, {}).items())
                if not pts:
                    continue
                ys = [(_pct(p.tflops, peak) if normalised else p.tflops) for _, p in pts]
                ax.plot([s for s, _ in pts], ys, linestyle=ls, marker="o", color=cmap(i % 10),
                        label="{} · {}".format(v, res.device_label))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("seqlen_kv")
        ax.set_ylabel("% of own measured bf16 GEMM" if normalised else "TFLOP/s")
        ax.set_title(fam, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    F._save(fig, path)
    return ("{} solid, {} dashed; best config per variant on each GPU.".format(a.device_label, b.device_label)
            + (" Each GPU is divided by its own measured ceiling ({} and {} TFLOP/s).".format(
                _fmt(pa, 0), _fmt(pb, 0)) if normalised else ""))


def build(path_a: str, path_b: str, out_dir: str, embed: bool = True) -> str:
    a, b = R.load(path_a), R.load(path_b)
    fig_dir = os.path.join(out_dir, "figures")
    os.makedirs(fig_dir, exist_ok=True)
    la, lb = a.device_label, b.device_label
    if la == lb:
        la, lb = la + " (A)", lb + " (B)"
    made, omitted = [], []
    for title, stem, norm in (("Absolute TFLOP/s", "bringup_abs", False),
                              ("Normalised by each GPU's measured ceiling", "bringup_norm", True)):
        path = os.path.join(fig_dir, stem + ".png")
        try:
            made.append((title, path, plot_pair(a, b, path, norm)))
        except F.Omitted as e:
            omitted.append((title, str(e)))

    pa, pb = a.ceiling("gemm_bf16_tflops"), b.ceiling("gemm_bf16_tflops")
    am, bm = a.by_name(), b.by_name()
    common = [n for n in am if n in bm]
    rows, md_rows, not_ok = [], [], []
    for n in common:
        x, y = am[n], bm[n]
        if not (x.ok and y.ok):
            not_ok.append([n, x.status, y.status, x.reason or y.reason])
            continue
        speed = x.median_us / y.median_us
        row = [n, "{:.2f}".format(x.median_us), "{:.2f}".format(y.median_us), _fmt(x.tflops), _fmt(y.tflops),
               "{:.2f}×".format(speed), _fmt(_pct(x.tflops, pa)), _fmt(_pct(y.tflops, pb))]
        rows.append(row)
        md_rows.append("| `{}` | {} |".format(n, " | ".join(row[1:])))
    headers = ["point", "A µs", "B µs", "A TFLOP/s", "B TFLOP/s", "B speed-up over A", "A % ceiling", "B % ceiling"]
    only_a = [n for n in am if n not in bm]
    only_b = [n for n in bm if n not in am]

    body = ["<p>A = {} ({}), B = {} ({}). {} points in both, {} timed ok on both; {} only in A, {} only in B.</p>"
            .format(page.esc(la), page.esc(path_a), page.esc(lb), page.esc(path_b), len(common), len(rows),
                    len(only_a), len(only_b)),
            "<h2>Devices</h2>", page.table(["", "A: " + la, "B: " + lb], device_rows([a, b]))]
    for title, path, cap in made:
        body += ["<h2>{}</h2>".format(page.esc(title)), page.figure(path, cap, embed, out_dir)]
    body += ["<h2>Points timed on both</h2>",
             page.table(headers, rows, range(1, 8)) if rows else "<p>No point is ok on both GPUs.</p>"]
    if not_ok:
        body += ["<h2>Points not ok on one or both</h2>", page.table(["point", "A", "B", "reason"], not_ok)]
    if only_a or only_b:
        body += ["<h2>Points on one GPU only</h2>",
                 page.table(["point", "only in"], [[n, "A"] for n in only_a] + [[n, "B"] for n in only_b])]
    body += ["<h2>Figures omitted</h2>", page.omitted_list(omitted)]
    R.write_text_atomic(os.path.join(out_dir, "index.html"),
                        page.render("flashbench bring-up: {} vs {}".format(la, lb), body))
    md = ["# flashbench bring-up: A = {} vs B = {}".format(la, lb), "",
          "| device fact | A | B |", "|---|---|---|"]
    md += ["| {} | {} | {} |".format(*r) for r in device_rows([a, b])]
    md += ["", "| " + " | ".join(headers) + " |", "|---|" + "---:|" * 7] + md_rows
    R.write_text_atomic(os.path.join(out_dir, "bringup.md"), "\n".join(md) + "\n")
    return os.path.join(out_dir, "index.html")
