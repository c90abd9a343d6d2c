"""The evaluated items on which a policy and the baseline (bf16) disagree, with what each answered.

Why: the accuracy gap says how often FP8 loses an item, not which items or what it answered
instead; lm-eval users read `--log_samples` for that. Each policy run is paired with the baseline
run of the same seed and other axis values (the pairing the statistics use) and compared item by
item on the per-item samples (`eval/samples/<task>.jsonl`): a disagreement is a different score
(one right, one wrong) or, where both runs logged their responses, a different answer. Stores
written before the samples carried prompt, target and response still list the items (doc ids and
scores), with the text columns empty.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd

from analysis.tidy import axis_columns

TEXT_COLUMNS = ("prompt", "target", "response")
COLUMNS = ("policy", "seed", "axes", "task", "doc_id", "kind", "prompt", "target", "baseline_response",
           "policy_response", "baseline_value", "policy_value")
DISAGREEMENTS_CSV = "disagreements.csv"
POLICY_RIGHT, BASELINE_RIGHT, OTHER_ANSWER = "policy right", "baseline right", "another answer"


def disagreements(trials: pd.DataFrame, samples: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """One row per (policy run, task, item) that disagrees with its baseline run (`COLUMNS`);
    score flips first."""
    if trials.empty or samples.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    by_run = {run: sub for run, sub in samples.groupby("run_id", sort=False)}
    frames = [_pair(by_run[run], by_run[base], row, baseline) for run, base, row in _pairs(trials, baseline)
              if run in by_run and base in by_run]
    frames = [f for f in frames if not f.empty]
    if not frames:
        return pd.DataFrame(columns=list(COLUMNS))
    out = pd.concat(frames, ignore_index=True)
    order = out["kind"].map({BASELINE_RIGHT: 0, POLICY_RIGHT: 1, OTHER_ANSWER: 2})
    return out.assign(_o=order).sort_values(["policy", "_o", "task", "seed", "doc_id"]).drop(columns="_o")[list(COLUMNS)]


def _pairs(trials: pd.DataFrame, baseline: str) -> Iterator[tuple[str, str, pd.Series]]:
    """(policy run, its baseline run, the policy run's row) for every counted non-baseline run."""
    counted = trials[trials["counted"]] if "counted" in trials else trials
    keys = ["seed", *axis_columns(counted)]
    base = counted[counted["policy"] == baseline]
    index = {tuple(r[k] for k in keys): r["run_id"] for _, r in base.iterrows()}
    for _, row in counted[counted["policy"] != baseline].iterrows():
        match = index.get(tuple(row[k] for k in keys))
        if match is not None:
            yield row["run_id"], match, row


def _pair(mine: pd.DataFrame, base: pd.DataFrame, row: pd.Series, baseline: str) -> pd.DataFrame:
    cols = ["task", "doc_id", "value", *[c for c in TEXT_COLUMNS if c in mine.columns]]
    joined = mine[cols].merge(base[[c for c in cols if c in base.columns]], on=["task", "doc_id"], suffixes=("_p", "_b"))
    if joined.empty:
        return joined
    both = joined["value_p"].isin([0.0, 1.0]) & joined["value_b"].isin([0.0, 1.0])  # scores, not perplexities
    flipped = both & (joined["value_p"] != joined["value_b"])
    answered = _col(joined, "response_p").ne("") & _col(joined, "response_b").ne("")
    other = both & ~flipped & answered & (_col(joined, "response_p") != _col(joined, "response_b"))
    hit = joined[flipped | other]
    kind = pd.Series(OTHER_ANSWER, index=hit.index).where(~flipped[hit.index],
                                                          hit["value_p"].map({1.0: POLICY_RIGHT, 0.0: BASELINE_RIGHT}))
    axes = ", ".join(f"{c.removeprefix('axis.')}={row[c]}" for c in axis_columns(row.to_frame().T))
    return pd.DataFrame({
        "policy": row["policy"], "seed": row["seed"], "axes": axes, "task": hit["task"], "doc_id": hit["doc_id"],
        "kind": kind, "prompt": _col(hit, "prompt_p"), "target": _col(hit, "target_p"),
        "baseline_response": _col(hit, "response_b"), "policy_response": _col(hit, "response_p"),
        "baseline_value": hit["value_b"], "policy_value": hit["value_p"],
    })


def _col(frame: pd.DataFrame, name: str) -> pd.Series:
    """A text column, '' where the run did not log it (older stores)."""
    return frame[name].fillna("").astype(str) if name in frame else pd.Series("", index=frame.index)


SHOWN_PER_POLICY = 10  # items listed in the report per policy; every one is in disagreements.csv
PROMPT_CHARS = 160


def disagreement_blocks(found: pd.DataFrame, baseline: str) -> list:
    """The report section: per policy and task how many items flip which way, then the first
    items with prompt, target and both answers (all of them in `disagreements.csv`)."""
    from analysis.render import Heading, Para, Table

    if found.empty:
        return []
    counts = (found.assign(n=1).pivot_table(index=["policy", "task"], columns="kind", values="n", aggfunc="sum",
                                           fill_value=0).reset_index())
    for kind in (BASELINE_RIGHT, POLICY_RIGHT, OTHER_ANSWER):
        counts[kind] = counts[kind] if kind in counts else 0
    counts = counts.rename(columns={BASELINE_RIGHT: f"{baseline} right", OTHER_ANSWER: "both wrong, other answer"})
    blocks: list = [
        Heading(f"Items where a policy and {baseline} disagree"),
        Para(f"Each run is paired with the {baseline} run of the same seed and other axis values and compared item by "
             "item (lm-eval's per-item samples): one answered right and the other wrong, or both wrong with "
             f"different answers. Every such item, with prompt, target and both answers, is in `disagreements.csv`; "
             f"the first {SHOWN_PER_POLICY} per policy are listed below."),
        Table(counts.astype(str), "Items per policy and task (summed over seeds)."),
    ]
    shown = found.groupby("policy", sort=False).head(SHOWN_PER_POLICY)
    table = pd.DataFrame({
        "policy": shown["policy"], "seed": shown["seed"].astype(str), "task": shown["task"],
        "item": shown["doc_id"].astype(str), "prompt": shown["prompt"].map(_short), "target": shown["target"],
        baseline: shown["baseline_response"].where(shown["baseline_response"] != "", shown["baseline_value"].map(_score)),
        "policy answer": shown["policy_response"].where(shown["policy_response"] != "", shown["policy_value"].map(_score)),
    })
    return blocks + [Table(table.astype(str), "Stores written before the samples carried the answers show the "
                                              "scores (right / wrong) instead.")]


def _short(text: str) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= PROMPT_CHARS else "…" + flat[-PROMPT_CHARS:]  # the end: where the question is


def _score(value: float) -> str:
    return "right" if value == 1.0 else "wrong"
