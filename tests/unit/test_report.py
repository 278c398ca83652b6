"""The HTML report (issue 20): numbers in text beside every chart, one chart per coordinate of a
multivariate mean (each in its column's units), shares labelled as shares, a non-OK status
explained, the flag shown, and each statistic's earlier runs."""

from __future__ import annotations

import datetime as dt
import json
import re

import pytest

import spark_jobs.query as q


def _row(run, when, stat, kind, columns, estimate, bar, status="OK", covers="the exact dataset statistic",
         flagged=None, params=None):
    return {
        "run_id": run, "created_at": when, "job_name": "job", "dataset": "data", "statistic": stat,
        "kind": kind, "columns": columns, "estimand": "mean over persons", "algorithm": "alg",
        "algorithm_version": "4", "status": status, "estimate": estimate,
        "estimate_shape": [len(estimate)] if estimate else [0], "epsilon": 0.5, "delta": 1e-7,
        "neighbouring": "add/remove", "privacy_unit": "pid", "error_bar": bar, "error_level": 0.9,
        "error_covers": covers, "parameters": json.dumps(params or {}), "flagged": flagged,
    }


@pytest.fixture
def releases(monkeypatch):
    t0 = dt.datetime(2026, 12, 1, 10, 0)
    rows = []
    for i in range(3):  # three runs; the newest (i = 2) is reported
        when = t0 + dt.timedelta(hours=i)
        run = f"run-{i}"
        rows.append(_row(run, when, "delay", "mean", ["arr_delay"], [7.0 + i], [0.25], flagged=(i == 2)))
        rows.append(_row(run, when, "pair", "multivariate_mean", ["hours", "wage"], [40.0 + i, 2.5], [0.5, 0.01]))
        rows.append(_row(run, when, "dest", "distribution", ["dest"], [0.6, 0.3, 0.1], [0.02, 0.02, 0.01],
                         params={"categories": ["ATL", "BOS", "OTHER"]}))
        rows.append(_row(run, when, "tiny", "mean", ["x"], None, None, status="INSUFFICIENT_DATA",
                         covers="none: no magnitude bucket passed the threshold (too few persons)"))
    rows.sort(key=lambda r: (r["created_at"], r["statistic"]), reverse=True)
    monkeypatch.setattr(q, "read_releases", lambda table, run_id=None: rows)
    return rows


def test_report_has_numbers_units_charts_failure_reason_flag_and_history(releases, tmp_path):
    page = q.write_report("unused", str(tmp_path))
    text = page.read_text()
    assert "Release run-2" in text
    # numbers in text, with their units
    assert "<td>9</td>" in text and "&plusmn; 0.25" in text and "units of arr_delay" in text
    assert "<td>42</td>" in text and "units of hours" in text and "units of wage" in text
    assert "<th>ATL</th><td>0.6</td>" in text and "share of the person-level distribution" in text
    # one chart per coordinate of the multivariate mean, one for the distribution, one for the mean
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == ["delay.png", "dest.png", "pair__0.png", "pair__1.png"]
    # the failure explained, no chart for it
    assert "No estimate was released (INSUFFICIENT_DATA)" in text
    assert "Why: no magnitude bucket passed the threshold (too few persons)" in text
    # the flag shown for the flagged release only
    assert text.count("<b>Flagged:</b>") == 1
    # history: each statistic lists its two earlier runs (newest first), not the reported one
    delay = text[text.index("<h2>delay</h2>"):text.index("<h2>dest</h2>")]
    hist = delay[delay.index("Earlier runs"):]
    assert re.findall(r"<td>(\d+(?:\.\d+)?) &plusmn;", hist) == ["8", "7"]
    assert "run-2" not in hist


def test_report_of_a_named_run_and_its_history(releases, tmp_path):
    text = q.write_report("unused", str(tmp_path), run_id="run-1").read_text()
    assert "Release run-1" in text
    delay = text[text.index("<h2>delay</h2>"):text.index("<h2>dest</h2>")]
    assert re.findall(r"<td>(\d+(?:\.\d+)?) &plusmn;", delay[delay.index("Earlier runs"):]) == ["7"]


def test_report_without_releases_says_so(monkeypatch, tmp_path):
    monkeypatch.setattr(q, "read_releases", lambda table, run_id=None: [])
    with pytest.raises(FileNotFoundError, match="no releases"):
        q.write_report("t", str(tmp_path))
