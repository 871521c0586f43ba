"""Report pages as a user sees them: the expiry charts stay readable on long saw-tooth runs (not one
colour block), policies that coincide are one line that names them all, legends sit beside the data, and
every chart of the expiry and audit pages renders in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from jobs.reports.expiry_report import MAX_POINTS, disk_figure, loss_figure, render_html

HOUR = 3_600_000


def policy(name: str, used: np.ndarray, lost: int = 0, capacity: int | None = 8 * 2**30) -> dict:
    t0 = 1_795_000_000_000
    usage = [{"time_ms": t0 + i * 10_000, "used_bytes": int(u), "store_bytes": int(u), "ratio": 0.0}
             for i, u in enumerate(used)]
    return {"name": name, "warnings": [], "deletions": [], "groups": [], "disk_usage": usage,
            "settings": {"file_reserved_time": 72, "delete_when": "04", "disk_max_used_space_ratio": 75,
                         "disk_capacity": capacity},
            "summary": {"commitlog_deleted": 0, "by_reason": {"time": 0, "space": 0, "forced": 0, "manual": 0},
                        "first_deletion_ms": None, "lost_messages": lost, "lost_bytes": lost * 100,
                        "groups_with_loss": 1 if lost else 0, "first_loss_ms": None, "max_ratio": 0.7}}


def sawtooth(n: int, low: float, high: float, period: int) -> np.ndarray:
    return low + (high - low) * ((np.arange(n) % period) / period)


@pytest.fixture
def policies() -> list[dict]:
    n = 60_000  # a week of 10 s cleaner runs: the point-by-point plot was one solid block
    a = sawtooth(n, 5e9, 6e9, 37)
    return [policy("keep-72h", a, lost=0), policy("keep-72h-copy", a, lost=0),
            policy("keep-24h", sawtooth(n, 2e9, 3e9, 23), lost=12_345)]


def test_long_runs_are_drawn_as_peaks_and_troughs_and_identical_policies_as_one_line(policies):
    fig = disk_figure(policies)
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
    labels = [line.get_label() for line in lines]
    assert "keep-72h = keep-72h-copy" in labels and "keep-24h" in labels
    assert any(label.startswith("capacity 8.59 GB") for label in labels)
    assert all(len(line.get_xdata()) <= MAX_POINTS for line in ax.get_lines())
    peaks = next(line for line in lines if line.get_label() == "keep-24h").get_ydata()
    assert peaks.max() == pytest.approx(3e9, rel=0.05) and peaks.min() > 2.9e9  # the peak of each interval


def test_legends_sit_outside_the_plot_area(policies):
    for fig in (disk_figure(policies),):
        fig.canvas.draw()
        ax = fig.axes[0]
        legend = ax.get_legend().get_window_extent()
        assert not legend.overlaps(ax.get_window_extent())


def test_losses_chart_labels_its_bars_and_is_replaced_by_a_sentence_when_nothing_is_lost(policies):
    fig = loss_figure(policies)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "12,345" in texts
    assert loss_figure(policies[:2]) is None
    page = render_html({"simulation": {}, "policies": policies[:2]})
    assert "No policy deletes a message before its consumer groups have read it." in page


def _chromium() -> str:
    found = next((shutil.which(c) for c in ("chromium", "chromium-browser", "google-chrome") if shutil.which(c)), None)
    if found is None:
        pytest.skip("chromium not found (install the Debian package 'chromium')")
    return found


def _screenshot(html_path: Path, png: Path, tmp: Path, size: str = "1000,700") -> np.ndarray:
    import matplotlib.image as mpimg

    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp / 'chrome'}", f"--screenshot={png}", f"--window-size={size}",
                    f"file://{html_path}"], check=True, capture_output=True, timeout=120)
    return mpimg.imread(png)[:, :, :3]


def _charts(page: str) -> list[str]:
    return re.findall(r"<svg.*?</svg>", page, re.S)


def _check_chart(svg: str, tmp: Path, i: int) -> None:
    """One chart alone on a white page: drawn (not blank) and not one colour block."""
    page = tmp / f"chart{i}.html"
    page.write_text(f"<!doctype html><html><body style='margin:0;background:#fff'>{svg}</body></html>")
    img = _screenshot(page, tmp / f"chart{i}.png", tmp)
    ink = (img < 0.97).any(axis=2)
    assert ink.mean() > 0.005, f"chart {i} is blank"
    assert ink.mean() < 0.35, f"chart {i}: {ink.mean():.0%} of the page is ink (a solid block)"
    colours = np.unique((img[ink] * 8).astype(int), axis=0)
    assert len(colours) >= 3, f"chart {i} has one colour"


def test_every_expiry_chart_renders_readably_in_headless_chromium(policies, tmp_path):
    page = render_html({"simulation": {"store": "s"}, "policies": policies})
    charts = _charts(page)
    assert len(charts) == 2  # disk usage and losses
    for i, svg in enumerate(charts):
        _check_chart(svg, tmp_path, i)
    full = tmp_path / "expiry.html"
    full.write_text(page)
    img = _screenshot(full, tmp_path / "expiry.png", tmp_path, "1280,2000")
    assert (img < 0.97).any(axis=2).mean() > 0.01


def test_every_audit_chart_renders_readably_in_headless_chromium(sample_498, tmp_path):
    from jobs.audit import audit_store, write_reports
    from tests.conftest import broker_conf

    rep = audit_store(str(sample_498 / "store"), broker_conf=str(broker_conf("4.9.8")), quiet=True)
    _, hp = write_reports(rep, str(tmp_path / "rep"))
    page = Path(hp).read_text()
    charts = _charts(page)
    assert charts
    for i, svg in enumerate(charts):
        _check_chart(svg, tmp_path, 100 + i)
