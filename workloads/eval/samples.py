"""What a reader needs of each evaluated item, taken from lm-eval's own logged sample record
(`simple_evaluate(log_samples=True)`, what `lm_eval --log_samples` writes): the prompt, the target,
the model's response (the generated text, or the option with the highest log-likelihood) and, for
multiple choice, every option with its log-likelihood.

Why: `{doc_id, metric, value}` says that a policy got an item wrong, not what it answered; a user
comparing FP8 with BF16 wants to read the items where they disagree. Nothing is re-scored: the
fields are lm-eval's `arguments`, `target` and `filtered_resps` (the responses after the task's
filters, the ones its metrics scored), and its `doc_hash`/`prompt_hash`/`target_hash`.
"""
from __future__ import annotations

from typing import Any, Mapping

HASHES = ("doc_hash", "prompt_hash", "target_hash")


def readable_fields(sample: Mapping[str, Any], output_type: str | None) -> dict[str, Any]:
    """prompt, target, response (+ choices, choice_loglikelihoods, gold for multiple choice) of one
    logged sample; fields lm-eval did not log are left out."""
    arguments = [a if isinstance(a, (list, tuple)) else (a,) for a in sample.get("arguments") or []]
    out: dict[str, Any] = {}
    if arguments:
        out["prompt"] = str(arguments[0][0])
    if "target" in sample:
        out["target"] = str(sample["target"])  # as lm-eval writes it
    responses = sample.get("filtered_resps")
    if output_type == "multiple_choice" and arguments and isinstance(responses, (list, tuple)) and responses:
        out.update(_choices(arguments, responses, sample.get("target")))
    elif output_type == "generate_until" and responses is not None:
        first = responses[0] if isinstance(responses, (list, tuple)) and responses else responses
        out["response"] = str(first)
    out.update({key: sample[key] for key in HASHES if key in sample})
    return out


def _choices(arguments: list[Any], responses: Any, target: Any) -> dict[str, Any]:
    """Each option (the continuation lm-eval scored), its log-likelihood, the chosen one (highest
    log-likelihood: what `acc` scores) and the gold option when the target is its index."""
    choices = [str(a[1]) if len(a) > 1 else "" for a in arguments]
    lls = [float(r[0] if isinstance(r, (list, tuple)) else r) for r in responses]
    fields: dict[str, Any] = {"choices": choices, "choice_loglikelihoods": lls,
                              "response": choices[max(range(len(lls)), key=lls.__getitem__)]}
    if isinstance(target, int) and not isinstance(target, bool) and 0 <= target < len(choices):
        fields["gold"] = choices[target]
    return fields
