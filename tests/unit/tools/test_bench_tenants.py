"""`cosyq-worker bench tenants`'s verdict and table (the fair share itself is tested through
real workers in tests/integration/service/test_tenants.py)."""

from __future__ import annotations

from workers.tools.bench.tenants import bound, format_table


def report(positions: list[int], batch_size: int) -> dict:
    last = max(positions)
    return {
        "cpu": {"model": "test"},
        "load_average_before": [0.0],
        "load_average": [0.0],
        "alpha_jobs": 200,
        "beta_jobs": 5,
        "rows": [
            {
                "batch_size": batch_size,
                "beta_positions": positions,
                "beta_last_position": last,
                "bound": bound(5, batch_size),
                "met": last <= bound(5, batch_size),
                "beta_done_s": 1.0,
            }
        ],
    }


def test_the_bound_is_beta_jobs_times_tenants_plus_the_batch() -> None:
    assert bound(5, 1) == 11 and bound(5, 8) == 18


def test_the_table_says_met_or_missed_per_batch_size() -> None:
    assert format_table(report([2, 4, 6, 8, 10], 1)).splitlines()[-1].endswith("met")
    assert format_table(report([201, 202, 203, 204, 205], 1)).splitlines()[-1].endswith("MISSED")
