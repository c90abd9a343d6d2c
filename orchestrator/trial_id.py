"""Stable trial identity: a hash of the resolved config minus fields that do not change results,
and of the content of the data and model it reads (`orchestrator.content_digest`).

Two trials with the same id would produce the same result (up to hardware nondeterminism), so
a sweep can skip a trial whose id already FINISHED. Key order never matters (sorted JSON); a data
file, model file or eval task file (YAML, its data, the include path) edited in place gives a new
id, and so does another lm-eval version (`orchestrator.eval_digest`); the config alone would not
change.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from fp8lab_conf.contracts import ID_NEUTRAL_DEFAULTS, NON_SEMANTIC_KEYS


def semantic_config(config: dict) -> dict:
    """The config with non-semantic keys removed, and keys at their id-neutral default."""
    pruned = copy.deepcopy(config)
    for dotted in NON_SEMANTIC_KEYS:
        _drop(pruned, dotted)
    for dotted, neutral in ID_NEUTRAL_DEFAULTS.items():
        _drop(pruned, dotted, only_if=neutral)
    return pruned


_ANY = object()


def _drop(config: dict, dotted: str, only_if: Any = _ANY) -> None:
    *parents, leaf = dotted.split(".")
    node: Any = config
    for part in parents:
        node = node.get(part, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict) and leaf in node and (only_if is _ANY or node[leaf] == only_if):
        del node[leaf]


def compute_trial_id(config: dict) -> str:
    """16 hex chars of SHA-256 over the canonical JSON of the semantic config and content digests."""
    from orchestrator.content_digest import content_digests  # noqa: PLC0415
    from orchestrator.eval_digest import eval_digests  # noqa: PLC0415

    keyed = {**semantic_config(config), "_content": {**content_digests(config), **eval_digests(config)}}
    canonical = json.dumps(keyed, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
