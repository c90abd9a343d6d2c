"""Keys added for user data (`train.epochs`, `train.grad_accum`, `data.chat_template`,
`data.max_truncated_pct`) leave a trial's id as it was while they are at the value that trains
what a config without them trained; any other value is another trial."""
from __future__ import annotations

import copy

from orchestrator.config_loader import compose_config, to_container
from orchestrator.trial_id import compute_trial_id

NEW_KEYS = {"train": ("epochs", "grad_accum"), "data": ("chat_template", "max_truncated_pct")}


def _without_new_keys(config: dict) -> dict:
    """The config as it was composed before those keys existed."""
    old = copy.deepcopy(config)
    for group, keys in NEW_KEYS.items():
        for key in keys:
            del old[group][key]
    return old


def test_new_keys_at_their_neutral_value_keep_the_id() -> None:
    config = to_container(compose_config(["train.max_seq_len=32"]))
    assert compute_trial_id(config) == compute_trial_id(_without_new_keys(config))
    assert compute_trial_id({**config, "data": {**config["data"], "max_truncated_pct": 50}}) == compute_trial_id(config)


def test_other_values_are_other_trials() -> None:
    config = to_container(compose_config(["train.max_seq_len=32"]))
    base = compute_trial_id(config)
    for group, key, value in (("train", "grad_accum", 2), ("train", "epochs", 1.0), ("data", "chat_template", "{{ x }}")):
        changed = copy.deepcopy(config)
        changed[group][key] = value
        assert compute_trial_id(changed) != base, key
