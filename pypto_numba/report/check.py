"""``--check``: the committed pages and charts against the regenerated ones, measured sections ignored."""

from __future__ import annotations

import difflib
import os
import re

from .charts import PLOT_HINT, svg_matplotlib_version


MEASURED_RE = re.compile(r"<!-- measured:begin (\S+) -->\n.*?<!-- measured:end \1 -->\n", re.S)


def strip_measured(text: str) -> str:
    """``text`` with every measured section emptied (its markers stay, so moving one is a change)."""
    return MEASURED_RE.sub(
        lambda m: f"<!-- measured:begin {m.group(1)} -->\n<!-- measured:end {m.group(1)} -->\n", text)


def old_measured(path) -> dict:
    """The measured blocks of a page already on disk: id -> inner lines."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    out = {}
    for m in MEASURED_RE.finditer(text):
        inner = m.group(0).split("\n")[1:-2]
        out[m.group(1)] = inner
    return out


def _check(out_dir, pages, files, have_mpl, stream) -> int:
    bad = []
    for rel, text in pages.items():
        path = os.path.join(out_dir, rel)
        try:
            with open(path, encoding="utf-8") as fh:
                old = fh.read()
        except FileNotFoundError:
            bad.append((rel, [f"missing: {path}\n"]))
            continue
        a, b = strip_measured(old), strip_measured(text)
        if a != b:
            diff = list(difflib.unified_diff(a.splitlines(True), b.splitlines(True), f"committed/{rel}",
                                             f"regenerated/{rel}", n=1))
            bad.append((rel, diff))
    skipped = ""
    if have_mpl:
        import matplotlib

        for rel, data in files.items():
            path = os.path.join(out_dir, rel)
            try:
                with open(path, "rb") as fh:
                    old = fh.read()
            except FileNotFoundError:
                bad.append((rel, [f"missing: {path}\n"]))
                continue
            made_with = svg_matplotlib_version(old)
            if made_with != matplotlib.__version__:
                skipped = (f"charts not compared: they were made with matplotlib {made_with}, "
                           f"this is {matplotlib.__version__}")
                continue
            if old != data:
                bad.append((rel, [f"{rel}: chart bytes differ ({len(old)} B committed, {len(data)} B regenerated)\n"]))
    else:
        skipped = f"charts not compared: matplotlib is not installed ({PLOT_HINT}) or charts=False"
    if skipped:
        stream.write(f"report --check: {skipped}; the markdown tables hold the charted numbers\n")
    if not bad:
        stream.write(f"report --check: {len(pages)} pages" + ("" if skipped else f" and {len(files)} charts")
                     + f" in {out_dir} are up to date\n")
        return 0
    for rel, diff in bad:
        stream.write(f"--- {rel} differs:\n")
        stream.writelines(diff[:40])
        if len(diff) > 40:
            stream.write(f"... ({len(diff) - 40} more diff lines)\n")
    stream.write(f"report --check: {len(bad)} file(s) out of date in {out_dir}: "
                 + ", ".join(rel for rel, _ in bad) + "\nrun `pypto-numba report` to update\n")
    return 1
