"""`python -m workloads.precision.catalog`: the registered precision policies as JSON, for
`fp8lab policies` (the driver never imports torch, so it asks this child process).

Everything comes from the policy registry: a policy registered in `policy.py` or a ladder rung in
`ladder.py` is listed without any other change."""
from __future__ import annotations

import json
import sys
from typing import Any

from workloads.precision.policy import available_policies, get_policy


def policy_rows() -> list[dict[str, Any]]:
    """name, version, one-line description, ladder base and mechanism of every registered policy."""
    rows = []
    for name in available_policies():
        policy = get_policy(name)
        text = policy.mechanism_desc if policy.ladder_base else policy.description  # a rung: what it moves
        rows.append({"name": name, "version": policy.version, "description": one_line(text),
                     "ladder_base": policy.ladder_base, "mechanism": policy.mechanism})
    return rows


def one_line(text: str) -> str:
    """The first sentence of a description, on one line."""
    return " ".join(text.split(". ", 1)[0].split()).rstrip(".") + "."


if __name__ == "__main__":
    json.dump(policy_rows(), sys.stdout)
