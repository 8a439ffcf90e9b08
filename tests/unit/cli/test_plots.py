"""The plots README shows are readable (issue 51): every setting that varies in a sweep is in its bar's label,
memory as typed, no two labels alike and none overlapping (matplotlib's own text extents), axes scaled to the
data. Rendered with the Agg backend from rows shaped as ``kvspec fleet`` and ``simulate --sweep`` make them."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import pytest

from kvspec.cli.args import parse_bytes
from kvspec.cli.fleet import bar_labels, fleet_figure, size_as_typed
from kvspec.cli.simulate import sweep_figure
from kvspec.fleet.sweep import SweepPoint

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


def _fleet_row(point: SweepPoint, reuse: float, ttft: float) -> dict[str, Any]:
    # What run_point returns, as far as the plot reads it; the planned KV size is not the typed one.
    planned = None if point.memory is None else round(point.memory * 0.99988 / 2**30, 3)
    return {
        "point": dataclasses.asdict(point),
        "total": {
            "reuse_ratio": reuse,
            "ttft_ms_mean": ttft,
            "ttft_ms_p90": ttft * 2,
            "e2e_ms_mean": ttft * 3,
            "preemptions": 0,
            "load_imbalance": 1.0,
        },
        "blocks_per_instance": 4096,
        "kv_cache_gib_per_instance": planned,
        "wall_seconds": 1.0,
    }


def _tick_labels(fig: Any) -> list[Any]:
    fig.canvas.draw()
    return [t for t in fig.axes[0].get_yticklabels() if t.get_text()]


def _assert_readable(fig: Any, expected: list[str]) -> None:
    labels = _tick_labels(fig)
    assert [t.get_text() for t in labels] == expected
    assert len(set(expected)) == len(expected), "two bars read alike"
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels]
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), "two labels overlap"
    # every label inside the figure
    _width, height = fig.canvas.get_width_height()
    assert all(b.x0 >= 0 and b.y0 >= 0 and b.y1 <= height for b in boxes)


def test_the_tier_sweep_of_readme_labels_each_bar_with_its_host_and_pool_memory() -> None:
    """README's tier example: host 0,256GiB,1TiB x pool 0,4TiB, six bars that all read `exact 4x32.0GiB`."""
    points = [
        SweepPoint(
            model="llama-3.1-8b",
            trace="t",
            num_instances=4,
            router="exact",
            num_blocks=4096,
            host_memory=host,
            shared_pool=pool,
        )
        for host in (0, parse_bytes("256GiB"), parse_bytes("1TiB"))
        for pool in (0, parse_bytes("4TiB"))
    ]
    rows = [_fleet_row(p, 0.1 * i, 100.0 + i) for i, p in enumerate(points)]
    fig = fleet_figure(rows, "tiers")
    _assert_readable(
        fig,
        [
            f"exact\nhost {host}\npool {pool}"
            for host in ("none", "256GiB", "1TiB")
            for pool in ("none", "4TiB")
        ],
    )
    assert fig.axes[0].get_xlim() == pytest.approx((0, 0.5 * 1.1))


def test_ten_bars_of_routers_and_memories_do_not_overlap_and_show_memory_as_typed() -> None:
    routers = ("round_robin", "exact", "kv_cost", "cache_aware", "precise_prefix")
    points = [
        SweepPoint(model="m", trace="t", num_instances=8, router=r, memory=parse_bytes(m))
        for r in routers
        for m in ("64GiB", "1.5TiB")
    ]
    rows = [_fleet_row(p, 0.3, 50.0) for p in points]
    expected = [f"{r}\n{m} KV" for r in routers for m in ("64GiB", "1.5TiB")]
    _assert_readable(fleet_figure(rows, "ten"), expected)
    assert "63.99" not in "".join(bar_labels(rows))


@pytest.mark.parametrize(
    ("typed", "shown"),
    [
        ("64GiB", "64GiB"),
        ("1.5TiB", "1.5TiB"),
        ("80GB", "80GB"),
        ("512MiB", "512MiB"),
        ("1000000001B", "0.93GiB"),
    ],
)
def test_sizes_read_as_typed(typed: str, shown: str) -> None:
    assert size_as_typed(parse_bytes(typed)) == shown


def test_a_sweep_of_small_hit_rates_is_not_drawn_flat_on_the_floor() -> None:
    rows = [
        {
            "policy": "lru",
            "num_blocks": n,
            "kv_cache_gib": n / 100,
            "token_hit_rate": rate,
            "block_hit_rate": rate / 2,
        }
        for n, rate in ((100, 0.004), (1000, 0.02), (10000, 0.06))
    ]
    fig = sweep_figure(rows, "small")
    assert fig.axes[0].get_ylim() == pytest.approx((0, 0.06 * 1.15))
    rows[2]["token_hit_rate"] = 0.95
    assert sweep_figure(rows, "large").axes[0].get_ylim() == pytest.approx((0, 1.0))
