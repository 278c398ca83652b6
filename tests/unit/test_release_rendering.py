"""``releases list`` / ``releases show`` output that fits a terminal (issue 20: lines of 1,383
characters), without losing any value."""

from __future__ import annotations

import json

from spark_jobs.query import MAX_CELL, RELEASE_COLUMNS, render, render_records


def _row():
    return {
        "run_id": "r-" + "a" * 30,
        "created_at": "2026-12-02 07:00:00",
        "job_name": "flights",
        "statistic": "dest_distribution",
        "status": "OK",
        "flagged": None,
        "estimate": [0.0123456789 * i for i in range(25)],
        "error_bar": [0.001 * i for i in range(25)],
        "error_level": 0.9,
        "epsilon": 0.5,
        "delta": 0.0,
        "algorithm": "shares",
        "error_covers": "the exact dataset statistic, at 90%: " + "Laplace noise of the summed share vectors " * 15,
        "parameters": json.dumps({"categories": [f"cat{i}" for i in range(40)], "rounding": 2**-30,
                                  "note": "x" * 300}),
    }


def test_show_wraps_every_line_to_the_width_and_keeps_every_value():
    row = _row()
    cols = list(row)
    text = render_records([row, row], cols, width=100)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    flat = " ".join(line.strip() for line in lines)
    # nothing is cut: every category, the whole note and every estimate are in the output
    for i in range(40):
        assert f"cat{i}" in flat
    assert "x" * 90 in text.replace("\n", "").replace(" ", "")
    assert flat.count("dest_distribution") == 2  # one block per row
    assert "parameters:" in text and "rounding = 9.31323e-10" in text


def test_list_table_cuts_long_cells_but_json_and_csv_keep_them():
    row = _row()
    table = render([row], RELEASE_COLUMNS, "table")
    for line in table.splitlines():
        for cell in line.split("  "):
            assert len(cell.strip()) <= MAX_CELL
    assert "..." in table
    full = json.loads(render([row], RELEASE_COLUMNS, "json"))[0]
    assert full["estimate"] == row["estimate"]
    csv_text = render([row], RELEASE_COLUMNS, "csv")
    assert ";".join(f"{x:.6g}" for x in row["estimate"]) in csv_text


def test_matrix_bar_lines_lay_the_error_bars_out_like_the_matrix():
    """A matrix release's per-entry bars print under the matrix in its layout, with their level
    (a new user found the covariance's bars only as a flat list of 16 numbers); none without a
    bar or for a vector."""
    from spark_jobs.query import matrix_bar_lines, matrix_lines

    r = {"estimate_shape": [2, 2], "estimate": [1.0, 0.5, 0.5, 2.0], "error_bar": [0.1, 0.25, 0.25, 3e4],
         "error_level": 0.9, "columns": ["u", "v"]}
    lines = matrix_bar_lines(r)
    assert lines[0] == "+/- per entry (90% error bar)"
    assert lines[1:] == matrix_lines({**r, "estimate": r["error_bar"]})
    assert lines[2].split() == ["u", "0.1", "0.25"] and lines[3].split() == ["v", "0.25", "30000"]
    assert matrix_bar_lines({**r, "error_bar": None}) == []
    assert matrix_bar_lines({**r, "estimate_shape": [4], "error_bar": [1.0] * 4}) == []
