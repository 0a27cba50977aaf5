"""GraphRule: the split of a step into graph and eager parts, against a brute-force reading of its contract."""

from __future__ import annotations

import random

import pytest

from tokenrouter.core.graph_rule import GraphRule


def test_bucket_for_is_the_smallest_holding_bucket():
    rule = GraphRule(buckets=(8, 1, 4, 2))
    assert rule.buckets == (1, 2, 4, 8)
    assert [rule.bucket_for(n) for n in range(0, 10)] == [None, 1, 2, 4, 4, 8, 8, 8, 8, None]
    assert GraphRule(enabled=False).bucket_for(1) is None


def test_split_keeps_short_rows_in_the_graph_whatever_else_the_batch_holds():
    rule = GraphRule(buckets=(1, 2, 4, 8, 16), max_row_tokens=4, allow_split=True)
    graph, eager = rule.split([1, 300, 3, 1, 5, 4])
    assert graph == [0, 2, 3, 5] and eager == [1, 4]


def test_split_respects_the_largest_bucket():
    rule = GraphRule(buckets=(1, 2, 4), max_row_tokens=4, allow_split=True)
    assert rule.split([3, 2, 1]) == ([0, 2], [1])  # 3 + 1 fit 4; the 2-token row does not fit after the 3
    assert GraphRule(enabled=False).split([1, 1]) == ([], [0, 1])


@pytest.mark.parametrize("seed", range(20))
def test_split_contract_on_random_batches(seed):
    rng = random.Random(seed)
    rule = GraphRule(
        buckets=tuple(sorted(rng.sample(range(1, 64), 5))), max_row_tokens=rng.randint(1, 12), allow_split=True
    )
    rows = [rng.choice([1, 1, 1, 2, 3, 8, 13, 40]) for _ in range(rng.randint(0, 30))]
    graph, eager = rule.split(rows)
    assert sorted(graph + eager) == list(range(len(rows)))
    assert sum(rows[i] for i in graph) <= max(rule.buckets)
    assert all(rows[i] <= rule.max_row_tokens for i in graph)
    # Greedy in batch order: an eager row that could run in a graph did not fit the room left before it.
    for j in eager:
        if rows[j] <= rule.max_row_tokens:
            used = sum(rows[i] for i in graph if i < j)
            assert used + rows[j] > max(rule.buckets)


def test_without_split_a_step_with_any_eager_row_runs_wholly_eager():
    assert GraphRule().allow_split is False  # the default: one pass per step
    rule = GraphRule(buckets=(1, 2, 4, 8, 16), max_row_tokens=4)
    assert rule.split([1, 300, 3]) == ([], [0, 1, 2])
    assert rule.split([1, 3, 4]) == ([0, 1, 2], [])


def test_invalid_rules_raise():
    with pytest.raises(ValueError):
        GraphRule(buckets=(0, 4))
    with pytest.raises(ValueError):
        GraphRule(max_row_tokens=0)
