"""Rewards that end a run early, for `--reward_funcs helpers.stops.NAME` (tests/test_zero_signal.py and
tests/test_unscorable_rewards.py): a solved task and a reward that cannot score anything."""

from __future__ import annotations


def solved(completions, **kwargs):
    """Every completion at the top of the declared range: nothing left to learn."""
    return [1.0] * len(completions)


solved.reward_range = (0.0, 1.0)


def cannot_score(completions, **kwargs):
    """None for every completion, as a reward whose reference column is missing would return."""
    return [None] * len(completions)
