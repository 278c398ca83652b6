"""Reading releases and the ledger without Spark (delta-rs), and the release report.

Used by ``person-dp releases ...``, ``person-dp budget show`` and ``person-dp report``.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
import shutil
import textwrap
from pathlib import Path

from spark_jobs.delta import read_delta  # noqa: F401  (re-exported: the public reader)
from spark_jobs.ledger import Ledger

RELEASE_COLUMNS = ["run_id", "created_at", "job_name", "statistic", "group_key", "status", "flagged", "estimate",
                   "error_bar", "error_level", "epsilon", "delta", "algorithm"]


def read_releases(table: str, run_id: str | None = None) -> list[dict]:
    """Release rows (newest first), optionally of one run id.

    Raises
    ------
    FileNotFoundError
        If there is no Delta table at ``table``.
    """
    try:
        rows = read_delta(table, {"run_id": run_id} if run_id else None).to_pylist()
    except FileNotFoundError as err:
        raise FileNotFoundError(f"no releases table at {table}") from err
    for r in rows:
        r["group_key"] = group_key_of(r)
    return sorted(rows, key=lambda r: (r["created_at"], r["statistic"], group_label(r)), reverse=True)


def group_key_of(row) -> dict | None:
    """A row's ``group_key`` as a dict (arrow reads a map as (key, value) pairs; rows written
    before the column existed have none)."""
    g = row.get("group_key") if isinstance(row, dict) else getattr(row, "group_key", None)
    if g is None:
        return None
    return dict(g) if isinstance(g, list) else g


def group_label(row) -> str:
    """``origin=JFK, month=1`` for a grouped row; "" for an ungrouped one."""
    g = group_key_of(row)
    return "" if not g else ", ".join(f"{k}={v}" for k, v in g.items())


def statistic_label(row) -> str:
    """The statistic's name, with its group for a grouped row: ``arr_delay_by_origin[origin=JFK]``."""
    name = row["statistic"] if isinstance(row, dict) else row.statistic
    label = group_label(row)
    return f"{name}[{label}]" if label else name


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return ";".join(_cell(x) for x in v)
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    return str(v)


#: Widest cell of the aligned text table (``releases list``); longer ones end in "...". The full
#: values are in ``releases show``, ``--format json`` and ``--format csv``.
MAX_CELL = 40
#: Line width of ``releases show`` when the terminal's is unknown.
DEFAULT_WIDTH = 100


def _short(text: str, limit: int = MAX_CELL) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _show_cell(v) -> str:
    if isinstance(v, list):  # items separated by spaces, so that lines wrap between items
        return ", ".join(_show_cell(x) for x in v)
    return _cell(v)


def render_records(rows: list[dict], columns: list[str], width: int | None = None) -> str:
    """Rows as blocks of ``name: value`` lines wrapped to ``width`` (the terminal's, else 100):
    one block per row, ``parameters`` (JSON) one key per line. Nothing is cut."""

    width = width or shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    width = max(width, 40)
    pad = max(len(c) for c in columns) + 2
    out: list[str] = []
    for r in rows:
        if out:
            out.append("")
        for c in columns:
            v = r.get(c)
            if c == "parameters" and isinstance(v, str):
                try:
                    params = json.loads(v)
                except ValueError:
                    params = None
                if isinstance(params, dict):
                    out.append(f"{c}:")
                    for k in sorted(params):
                        out.append(textwrap.fill(f"{k} = {_show_cell(params[k])}", width, initial_indent="  ",
                                                 subsequent_indent=" " * 6, break_long_words=True))
                    continue
            out.append(textwrap.fill(_show_cell(v), width, initial_indent=f"{c}:".ljust(pad),
                                     subsequent_indent=" " * pad, break_long_words=True) or f"{c}:")
    return "\n".join(out)


def render(rows: list[dict], columns: list[str], fmt: str) -> str:
    """Rows as an aligned text table (cells cut at ``MAX_CELL`` characters), JSON or CSV."""
    if fmt == "json":
        return json.dumps([{c: r.get(c) for c in columns} for r in rows], default=str, indent=2)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(columns)
        for r in rows:
            w.writerow([_cell(r.get(c)) for c in columns])
        return buf.getvalue()
    cells = [[_short(_cell(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def budget_rows(ledger_path: str) -> tuple[list[dict], list[dict]]:
    """(population rows with remaining budget, entry rows) of a ledger."""
    rows = Ledger(ledger_path).rows()
    pops = []
    for r in rows:
        if r["kind"] == "population":
            pops.append({**r, "remaining_epsilon": r["limit_epsilon"] - r["spent_epsilon"],
                         "remaining_delta": r["limit_delta"] - r["spent_delta"]})
    entries = sorted((r for r in rows if r["kind"] == "entry"), key=lambda r: r["updated_at"], reverse=True)
    return pops, entries


def coordinate_labels(r) -> list[str]:
    """Names of a release's coordinates: a distribution's public categories (+ OTHER), else the
    columns. ``r`` is a release row (dict or ReleaseRow)."""
    get = r.get if isinstance(r, dict) else lambda k: getattr(r, k)
    if get("kind") == "distribution":
        cats = json.loads(get("parameters")).get("categories")
        if cats and len(cats) == len(get("estimate") or []):
            return list(cats)
    return list(get("columns"))


def matrix_lines(r) -> list[str]:
    """Text lines of a release whose estimate is a matrix (``estimate_shape`` of length 2, e.g.
    BHS23's covariance d x d or gaussian (d+1) x d), rows labelled; [] for vectors."""
    get = r.get if isinstance(r, dict) else lambda k: getattr(r, k)
    shape, est = list(get("estimate_shape") or []), get("estimate")
    if len(shape) != 2 or not est or len(est) != shape[0] * shape[1]:
        return []
    cols = list(get("columns"))
    rows = cols if shape[0] == len(cols) else ["mean", *cols][: shape[0]]
    width = max(len(c) for c in rows + cols)
    out = [" " * width + "  " + "  ".join(c.rjust(12) for c in cols)]
    for i, name in enumerate(rows):
        out.append(name.ljust(width) + "  " + "  ".join(f"{v:12.6g}" for v in est[i * shape[1] : (i + 1) * shape[1]]))
    return out


def matrix_bar_lines(r) -> list[str]:
    """The per-entry error bars of a matrix release in the layout of :func:`matrix_lines`, under a
    heading with their level; [] when the release is not a matrix or has no bar."""
    get = r.get if isinstance(r, dict) else lambda k: getattr(r, k)
    bar, shape = get("error_bar"), list(get("estimate_shape") or [])
    if not matrix_lines(r) or not bar or len(bar) != shape[0] * shape[1]:
        return []
    level = get("error_level")
    lines = matrix_lines({"estimate_shape": shape, "estimate": list(bar), "columns": list(get("columns"))})
    head = f"+/- per entry ({int(round(level * 100))}% error bar)" if level else "+/- per entry (error bar)"
    return [head] + lines


#: Earlier runs of a statistic listed in its report section.
HISTORY_RUNS = 10


def _unit(r: dict, label: str) -> str:
    """What a coordinate's numbers are in: a share for a distribution, else the column's units."""
    return "share of the person-level distribution" if r["kind"] == "distribution" else f"units of {label}"


def _numbers_table(r: dict) -> str:
    """The released numbers as an HTML table: one row per coordinate or category."""
    if matrix_lines(r):
        shape = r["estimate_shape"]
        cols = list(r["columns"])
        labels = cols if shape[0] == len(cols) else ["mean", *cols][: shape[0]]
        head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
        body = "".join(
            f"<tr><th>{html.escape(labels[i])}</th>"
            + "".join(f"<td>{v:.6g}</td>" for v in r["estimate"][i * shape[1] : (i + 1) * shape[1]])
            + "</tr>"
            for i in range(shape[0])
        )
        return f"<table class='num'><tr><th></th>{head}</tr>{body}</table>"
    bars = r["error_bar"] or [None] * len(r["estimate"])
    level = int(round(r["error_level"] * 100))
    body = "".join(
        f"<tr><th>{html.escape(str(lab))}</th><td>{est:.6g}</td>"
        f"<td>{'&plusmn; ' + format(bar, '.3g') if bar is not None and math.isfinite(bar) else 'no bar'}</td>"
        f"<td>{html.escape(_unit(r, str(lab)))}</td></tr>"
        for lab, est, bar in zip(coordinate_labels(r), r["estimate"], bars)
    )
    return (f"<table class='num'><tr><th></th><th>estimate</th><th>{level}% error bar</th><th>in</th></tr>"
            f"{body}</table>")


def _history_table(r: dict, earlier: list[dict]) -> str:
    """Earlier releases of the same job and statistic, newest first (first coordinate shown)."""
    if not earlier:
        return "<p class='hist'>No earlier run of this statistic in the table.</p>"
    rows = []
    for h in earlier[:HISTORY_RUNS]:
        if h["status"] == "OK" and h["estimate"]:
            bar = (h["error_bar"] or [None])[0]
            val = f"{h['estimate'][0]:.6g}" + (f" &plusmn; {bar:.3g}" if bar is not None and math.isfinite(bar) else "")
            if len(h["estimate"]) > 1:
                val += f" (first of {len(h['estimate'])})"
        else:
            val = "&mdash;"
        flag = " (flagged)" if h.get("flagged") else ""
        rows.append(f"<tr><td>{html.escape(str(h['created_at']))}</td><td>{html.escape(h['run_id'][:14])}</td>"
                    f"<td>{html.escape(h['status'])}{flag}</td><td>{val}</td><td>{h['epsilon']:.4g}</td></tr>")
    more = f"<p class='hist'>{len(earlier) - HISTORY_RUNS} older runs not shown.</p>" if len(earlier) > HISTORY_RUNS else ""
    return ("<table class='hist'><tr><th>run at</th><th>run id</th><th>status</th><th>estimate</th>"
            f"<th>&epsilon;</th></tr>{''.join(rows)}</table>{more}")


def _not_released(r: dict) -> str:
    reason = r["error_covers"]
    reason = reason[len("none: "):] if reason.startswith("none: ") else reason
    return (f"<p class='fail'><b>No estimate was released ({html.escape(r['status'])}).</b> "
            f"Why: {html.escape(reason)}. The statistic still spent &epsilon;={r['epsilon']:.4g}, "
            f"&delta;={r['delta']:.3g} (the stages that ran).</p>")


def _section(r: dict, pngs: list[Path], earlier: list[dict]) -> str:
    imgs = "".join(f"<img src='{p.name}' alt='{html.escape(statistic_label(r))}'>" for p in pngs)
    ok = r["status"] == "OK" and bool(r["estimate"])
    params = r.get("parameters") or {}
    if isinstance(params, str):
        try:
            params = json.loads(params)
        except ValueError:
            params = {}
    l0_cut = bool(params.get("l0_truncated")) if isinstance(params, dict) else False
    tail = bool(params.get("tail_flag")) if isinstance(params, dict) else False
    why = []
    if tail or not l0_cut:
        why.append("the error bar rests on a tail assumption the release's own DP checks could not confirm; "
                   "it may be too narrow")
    if l0_cut:
        why.append("some persons hold more groups than max_groups_per_person and count in that many only: "
                   "the estimate and its bar are over the kept (person, group) pairs")
    flag = f"<p class='fail'><b>Flagged:</b> {html.escape('; '.join(why))}.</p>" if r.get("flagged") else ""
    return (
        f"<section><h2>{html.escape(statistic_label(r))}</h2>"
        + (_numbers_table(r) if ok else _not_released(r))
        + flag + imgs
        + f"<p><b>{html.escape(r['status'])}</b> &middot; estimand: {html.escape(r['estimand'])}</p>"
        f"<p>privacy: &epsilon;={r['epsilon']:.4g}, &delta;={r['delta']:.3g} per {html.escape(r['privacy_unit'])} "
        f"({html.escape(r['neighbouring'])}); algorithm {html.escape(r['algorithm'])} v{html.escape(r['algorithm_version'])}</p>"
        f"<p>the error bar covers {html.escape(r['error_covers'])}</p>"
        f"<h3>Earlier runs</h3>{_history_table(r, earlier)}</section>"
    )


def _safe_name(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in text)


def write_report(table: str, out_dir: str, run_id: str | None = None) -> Path:
    """A small HTML report of the newest run (or of ``run_id``): per released statistic, its numbers
    in a table (estimate, error bar, units, per coordinate or category), charts (one per coordinate
    of a multivariate mean, each in its column's units; one for a distribution's shares; a heat map
    for a matrix), why nothing was released when the status is not OK, a flag warning, the privacy
    metadata, and the statistic's earlier runs. Returns the HTML path."""
    import matplotlib  # lazy: matplotlib is the report extra, needed by this command only

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: after the non-interactive backend is chosen

    everything = read_releases(table)
    if run_id:
        rows = [r for r in everything if r["run_id"] == run_id]
    else:
        rows = everything
    if not rows:
        raise FileNotFoundError(f"no releases in {table}" + (f" for run {run_id}" if run_id else ""))
    run = rows[0]["run_id"]
    rows = [r for r in rows if r["run_id"] == run]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for r in sorted(rows, key=lambda r: (r["statistic"], group_label(r))):
        earlier = [h for h in everything if h["job_name"] == r["job_name"] and h["statistic"] == r["statistic"]
                   and group_label(h) == group_label(r) and h["created_at"] < r["created_at"]]
        base = _safe_name(statistic_label(r))
        pngs: list[Path] = []
        ok = r["status"] == "OK" and bool(r["estimate"])
        if ok and matrix_lines(r):
            # a matrix (BHS23 covariance / gaussian): a heat map with the values written in
            rows_n, cols_n = r["estimate_shape"]
            mat = [r["estimate"][i * cols_n : (i + 1) * cols_n] for i in range(rows_n)]
            fig, ax = plt.subplots(figsize=(1.2 + 1.1 * cols_n, 0.9 + 0.6 * rows_n))
            ax.imshow(mat, cmap="RdBu_r", aspect="auto")
            labels = list(r["columns"]) if rows_n == cols_n else ["mean", *r["columns"]]
            ax.set_xticks(range(cols_n), list(r["columns"]))
            ax.set_yticks(range(rows_n), labels[:rows_n])
            for i in range(rows_n):
                for j in range(cols_n):
                    ax.text(j, i, f"{mat[i][j]:.3g}", ha="center", va="center", fontsize=8)
            ax.set_title(statistic_label(r), fontsize=10)
            fig.tight_layout()
            pngs.append(out / f"{base}.png")
            fig.savefig(pngs[-1], dpi=110)
            plt.close(fig)
        elif ok and r["kind"] == "distribution":
            # shares of one distribution: one axis, in shares
            ys = list(range(len(r["estimate"])))
            bars = r["error_bar"] or [0.0] * len(ys)
            fig, ax = plt.subplots(figsize=(5.5, 0.6 + 0.4 * len(ys)))
            ax.errorbar(r["estimate"], ys, xerr=[bars, bars], fmt="o", capsize=5, color="#1f5fa8")
            ax.set_yticks(ys, [str(c) for c in coordinate_labels(r)])
            ax.set_xlabel("share of the person-level distribution")
            ax.set_title(f"{statistic_label(r)} ({int(round(r['error_level'] * 100))}% bars)", fontsize=10)
            fig.tight_layout()
            pngs.append(out / f"{base}.png")
            fig.savefig(pngs[-1], dpi=110)
            plt.close(fig)
        elif ok:
            # a mean, one chart per coordinate, each on its own axis in its column's units
            bars = r["error_bar"] or [None] * len(r["estimate"])
            for j, (lab, est, bar) in enumerate(zip(coordinate_labels(r), r["estimate"], bars)):
                fig, ax = plt.subplots(figsize=(5.5, 1.5))
                if bar is not None and math.isfinite(bar) and bar > 0:
                    ax.errorbar([est], [0], xerr=[[bar], [bar]], fmt="o", capsize=8, color="#1f5fa8")
                    ax.set_xlim(est - 2.5 * bar, est + 2.5 * bar)
                    title = f"{lab}: {est:.4g} ± {bar:.3g} ({int(round(r['error_level'] * 100))}%)"
                else:
                    ax.plot([est], [0], "o", color="#1f5fa8")
                    title = f"{lab}: {est:.4g} (no error bar)"
                ax.set_title(title, fontsize=10)
                ax.set_yticks([])
                ax.set_xlabel(str(lab))
                fig.tight_layout()
                pngs.append(out / (f"{base}.png" if len(r["estimate"]) == 1 else f"{base}__{j}.png"))
                fig.savefig(pngs[-1], dpi=110)
                plt.close(fig)
        parts.append(_section(r, pngs, earlier))
    page = out / "report.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Release report</title>"
        "<style>body{font-family:sans-serif;max-width:760px;margin:2em auto}section{margin-bottom:2em}"
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}"
        ".fail{color:#a00}</style>"
        f"</head><body><h1>Release {html.escape(run)}</h1><p>{html.escape(rows[0]['job_name'])} on "
        f"{html.escape(rows[0]['dataset'])}, {rows[0]['created_at']}</p>{''.join(parts)}</body></html>"
    )
    return page
