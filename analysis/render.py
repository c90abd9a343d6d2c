"""A report as a list of blocks, rendered to Markdown and to one self-contained HTML file.

Both outputs come from the same blocks, so they never disagree. Inline markup is the small
common subset: `code` and **bold**. HTML embeds figures as base64 PNG data URIs so the file can
be mailed or attached to a ticket without its folder.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import pandas as pd

from analysis.figures import FigureArtifact


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str
    kind: str = ""
    """'' or 'note' / 'warning' (styled in HTML, prefixed in Markdown)."""


@dataclass(frozen=True)
class Bullets:
    items: Sequence[str]


@dataclass(frozen=True)
class Table:
    frame: pd.DataFrame
    """Already formatted (strings); the index is not shown."""
    caption: str = ""


@dataclass(frozen=True)
class Image:
    figure: FigureArtifact


@dataclass(frozen=True)
class Document:
    title: str
    blocks: Sequence[Heading | Para | Bullets | Table | Image] = field(default_factory=list)


# --------------------------------------------------------------------------- markdown


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame) -> str:
    """GitHub pipe table."""
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(_md_cell(c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(_md_cell(v) for v in row) + " |")
    return "\n".join(lines)


def to_markdown(doc: Document, figure_dir: str = "figures") -> str:
    out = [f"# {doc.title}", ""]
    for b in doc.blocks:
        if isinstance(b, Heading):
            out += ["#" * max(2, min(b.level, 6)) + " " + b.text, ""]
        elif isinstance(b, Para):
            prefix = {"warning": "> **Warning:** ", "note": "> "}.get(b.kind, "")
            out += [prefix + b.text, ""]
        elif isinstance(b, Bullets):
            out += [f"- {item}" for item in b.items] + [""]
        elif isinstance(b, Table):
            if b.caption:
                out += [f"*{b.caption}*", ""]
            out += [markdown_table(b.frame), ""]
        elif isinstance(b, Image):
            f = b.figure
            out += [f"![{f.title}]({figure_dir}/{f.name}.png)", "", f"*{f.caption}*", ""]
    return "\n".join(out).rstrip() + "\n"


# --------------------------------------------------------------------------- html

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;border-bottom:2px solid #ddd;padding-bottom:.3em}h2{margin-top:1.8em;border-bottom:1px solid #eee}
table{border-collapse:collapse;margin:.8em 0;font-size:.85em;display:block;overflow-x:auto}
th,td{border:1px solid #ccc;padding:.3em .6em;text-align:left;white-space:nowrap}th{background:#f4f4f4}
tr:nth-child(even) td{background:#fafafa}code{background:#f2f2f2;padding:0 .2em;border-radius:3px}
figure{margin:1.2em 0}figure img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
.warning{background:#fff4e5;border-left:4px solid #f0a030;padding:.5em 1em}
.note{background:#eef5ff;border-left:4px solid #5b8def;padding:.5em 1em}
.caption{font-style:italic;color:#555;font-size:.9em}
"""

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def inline_html(text: str) -> str:
    """Escape, then turn `code` and **bold** into tags."""
    s = html.escape(str(text), quote=False)
    s = _CODE.sub(r"<code>\1</code>", s)
    return _BOLD.sub(r"<strong>\1</strong>", s)


def html_table(frame: pd.DataFrame) -> str:
    head = "".join(f"<th>{inline_html(c)}</th>" for c in frame.columns)
    rows = "".join(
        "<tr>" + "".join(f"<td>{inline_html(v)}</td>" for v in row) + "</tr>" for row in frame.itertuples(index=False)
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def to_html(doc: Document) -> str:
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(doc.title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{inline_html(doc.title)}</h1>",
    ]
    for b in doc.blocks:
        if isinstance(b, Heading):
            lvl = max(2, min(b.level, 6))
            anchor = re.sub(r"[^a-z0-9]+", "-", b.text.lower()).strip("-")
            parts.append(f'<h{lvl} id="{anchor}">{inline_html(b.text)}</h{lvl}>')
        elif isinstance(b, Para):
            cls = f' class="{b.kind}"' if b.kind else ""
            prefix = "<strong>Warning:</strong> " if b.kind == "warning" else ""
            parts.append(f"<p{cls}>{prefix}{inline_html(b.text)}</p>")
        elif isinstance(b, Bullets):
            parts.append("<ul>" + "".join(f"<li>{inline_html(i)}</li>" for i in b.items) + "</ul>")
        elif isinstance(b, Table):
            if b.caption:
                parts.append(f'<p class="caption">{inline_html(b.caption)}</p>')
            parts.append(html_table(b.frame))
        elif isinstance(b, Image):
            f = b.figure
            data = base64.b64encode(f.png).decode("ascii")
            parts.append(
                f'<figure id="fig-{html.escape(f.name)}"><img alt="{html.escape(f.title)}" '
                f'src="data:image/png;base64,{data}"><figcaption><strong>{inline_html(f.title)}.</strong> '
                f"{inline_html(f.caption)}</figcaption></figure>"
            )
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
