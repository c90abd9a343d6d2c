"""`fp8lab data preview <overrides>`: the training rows as a trial sees them, before any trial.

Prints the limit (`train.max_seq_len`, and where it came from), what it cuts from the whole
training split, and N rows rendered with the trained tokens marked: green (and inside [[ ]] when
the output is not a terminal, so a log or a pipe keeps the marks), with each row's token counts.
`--tokens` prints every token as `text(id, label)` like Axolotl's `preprocess --debug`. The work
is `workloads.data.preview` (the code a trial trains with), reached lazily through
`workloads.preflight` (as `fp8lab trial` is): the driver's other commands never load torch.
"""
from __future__ import annotations

import argparse
from typing import Any

from orchestrator.errors import UserInputError

TRAINED_MARKS = ("[[", "]]")


def add_data_parser(sub: Any) -> None:
    data = sub.add_parser("data", help="look at the training data as a trial sees it (data preview)")
    actions = data.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    show = actions.add_parser("preview", help="rendered rows with the trained tokens marked, token counts, truncation")
    show.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. data.path=/data/sft.jsonl data.format=chat")
    show.add_argument("-n", "--rows", type=int, default=5, help="rows to show (default 5)")
    show.add_argument("--start", type=int, default=0, help="first row to show (default 0)")
    show.add_argument("--tokens", action="store_true", help="every token as text(id, label), as Axolotl's preprocess --debug")
    show.add_argument("--config-dir", help="your own config folder, searched before fp8lab's")


def run_preview(args: argparse.Namespace, config: dict[str, Any]) -> int:
    """Print the preview of `config`'s training data; bad rows are one line each (exit 2)."""
    from rich.console import Console
    from rich.text import Text

    from workloads.preflight import preview_data

    if args.rows < 1 or args.start < 0:
        raise UserInputError("--rows: must be >= 1 and --start >= 0 (fix: fp8lab data preview -n 5)")
    try:
        shown = preview_data(config, args.rows, args.start)
    except ValueError as exc:  # a row that cannot be rendered: the data checks' one line
        raise UserInputError(str(exc)) from None
    out = Console(highlight=False, soft_wrap=True)
    for line in header_lines(shown, config):
        out.print(line, markup=False)
    marks = ("", "") if out.is_terminal else TRAINED_MARKS
    for row in shown.rows:
        out.print(row_header(row), markup=False, style="bold")
        if args.tokens:
            out.print(" ".join(_token_text(s, marks) for s in row.spans), markup=False)
        else:
            text = Text()
            for span in row.spans:
                text.append(f"{marks[0]}{span.text}{marks[1]}" if span.trained else span.text,
                            style="green" if span.trained else "")
            out.print(text)
    return 0


def header_lines(shown: Any, config: dict[str, Any]) -> list[str]:
    plan, cut = shown.plan, shown.plan.truncation
    source = "from the data: the 99th percentile of the rows' token counts, rounded up to 16" if shown.derived else "as set"
    lines = [f"data.path={shown.path} ({shown.fmt}): {cut.rows} training rows, longest {cut.longest} tokens; "
             f"{plan.steps} steps" + (f" (train.epochs={config['train']['epochs']})" if config["train"].get("epochs") else ""),
             f"train.max_seq_len={plan.max_seq_len} ({source})",
             f"truncation: {cut.rows_cut} of {cut.rows} rows ({cut.rows_pct:.1f}%) and {cut.tokens_cut} of {cut.tokens} tokens "
             f"({cut.tokens_pct:.1f}%) cut (rows keep their end); data.max_truncated_pct={config['data']['max_truncated_pct']:g}"]
    if plan.problem:
        lines.append(f"a trial would be refused: {plan.problem}")
    lines.append(f"trained tokens (the loss) in green, inside {TRAINED_MARKS[0]} {TRAINED_MARKS[1]} outside a terminal")
    return lines


def row_header(row: Any) -> str:
    cut = f"{row.cut} cut from the start to fit" if row.cut else "nothing cut"
    return f"-- row {row.index}: {row.length} tokens, {row.trained} trained, {cut}"


def _token_text(span: Any, marks: tuple[str, str]) -> str:
    label = (lambda i: str(i)) if span.trained else (lambda i: "-100")
    shown = " ".join(f"{tok}({i}, {label(i)})" for tok, i in zip(span.tokens, span.ids))
    return f"{marks[0]}{shown}{marks[1]}" if span.trained else shown
