"""Reading releases and the ledger without Spark (delta-rs), and the release report.

Used by ``person-dp releases ...``, ``person-dp budget show`` and ``person-dp report``.
"""

from __future__ import annotations

import csv
import html
import io
import json
import math
from pathlib import Path

RELEASE_COLUMNS = ["run_id", "created_at", "job_name", "statistic", "status", "flagged", "estimate",
                   "error_bar", "error_level", "epsilon", "delta", "algorithm"]


def read_delta(path: str, filter_eq: dict | None = None, columns: list[str] | None = None):
    """A Delta table's live rows as a pyarrow Table, without Spark.

    delta-rs resolves the live files from the Delta log (``file_uris``); pyarrow reads them.
    (delta-rs 1.6's own Arrow scan sometimes aborts the interpreter at exit with "terminate
    called without an active exception"; reading the files with pyarrow avoids it.)

    Raises
    ------
    FileNotFoundError
        If there is no Delta table at ``path``.
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        t = DeltaTable(path)
    except TableNotFoundError as err:
        raise FileNotFoundError(f"no Delta table at {path}") from err
    schema = t.schema().to_arrow()
    import pyarrow as pa

    schema = pa.schema(schema) if not isinstance(schema, pa.Schema) else schema
    uris = t.file_uris()
    if not uris:
        return schema.empty_table() if columns is None else schema.empty_table().select(columns)
    expr = None
    for k, v in (filter_eq or {}).items():
        cond = pc.field(k) == v
        expr = cond if expr is None else expr & cond
    return ds.dataset(uris, format="parquet", schema=schema).to_table(filter=expr, columns=columns)


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
    return sorted(rows, key=lambda r: (r["created_at"], r["statistic"]), reverse=True)


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return ";".join(_cell(x) for x in v)
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
    import shutil
    import textwrap

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
    from spark_jobs.ledger import Ledger

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


def _section(r: dict, png: Path) -> str:
    return (
        f"<section><h2>{html.escape(r['statistic'])}</h2><img src='{png.name}' alt='{html.escape(r['statistic'])}'>"
        f"<p><b>{html.escape(r['status'])}</b> &middot; estimand: {html.escape(r['estimand'])}</p>"
        f"<p>privacy: &epsilon;={r['epsilon']:.4g}, &delta;={r['delta']:.3g} per {html.escape(r['privacy_unit'])} "
        f"({html.escape(r['neighbouring'])}); algorithm {html.escape(r['algorithm'])} v{html.escape(r['algorithm_version'])}</p>"
        f"<p>the error bar covers {html.escape(r['error_covers'])}</p></section>"
    )


def write_report(table: str, out_dir: str, run_id: str | None = None) -> Path:
    """A small HTML report: one PNG per released statistic (estimate with its error bar) of the
    newest run (or of ``run_id``), with the privacy metadata beside it. Returns the HTML path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_releases(table, run_id)
    if not rows:
        raise FileNotFoundError(f"no releases in {table}" + (f" for run {run_id}" if run_id else ""))
    run = rows[0]["run_id"]
    rows = [r for r in rows if r["run_id"] == run]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = []
    for r in sorted(rows, key=lambda r: r["statistic"]):
        png = out / f"{r['statistic']}.png"
        fig, ax = plt.subplots(figsize=(5.5, 1.8))
        if r["status"] == "OK" and matrix_lines(r):
            # a matrix (BHS23 covariance / gaussian): a heat map with the values written in
            plt.close(fig)
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
            ax.set_title(r["statistic"], fontsize=10)
            fig.tight_layout()
            fig.savefig(png, dpi=110)
            plt.close(fig)
            parts.append(_section(r, png))
            continue
        if r["status"] == "OK" and r["estimate"] and len(r["estimate"]) > 1:
            # a vector: one row per coordinate, each with its own bar
            plt.close(fig)
            fig, ax = plt.subplots(figsize=(5.5, 0.6 + 0.5 * len(r["estimate"])))
            ys = list(range(len(r["estimate"])))
            bars = r["error_bar"] or [0.0] * len(ys)
            ax.errorbar(r["estimate"], ys, xerr=[bars, bars], fmt="o", capsize=6, color="#1f5fa8")
            ax.set_yticks(ys, [f"{c}: {e:.4g}" for c, e in zip(coordinate_labels(r), r["estimate"])])
            ax.set_title(f"{r['statistic']} ({int(r['error_level'] * 100)}% bars)", fontsize=10)
            ax.set_xlabel("data units")
            fig.tight_layout()
            fig.savefig(png, dpi=110)
            plt.close(fig)
            parts.append(_section(r, png))
            continue
        if r["status"] == "OK" and r["estimate"]:
            est = r["estimate"][0]
            bar = r["error_bar"][0] if r["error_bar"] else None
            if bar is not None and math.isfinite(bar):
                ax.errorbar([est], [0], xerr=[[bar], [bar]], fmt="o", capsize=8, color="#1f5fa8")
                ax.set_xlim(est - 2.5 * bar, est + 2.5 * bar)
            else:
                ax.plot([est], [0], "o", color="#1f5fa8")
            ax.set_title(f"{r['statistic']}: {est:.4g}" + (f" ± {bar:.3g} ({int(r['error_level'] * 100)}%)" if bar else ""),
                         fontsize=10)
        else:
            ax.text(0.5, 0.5, r["status"], ha="center", va="center", transform=ax.transAxes)
            ax.set_title(r["statistic"], fontsize=10)
        ax.set_yticks([])
        ax.set_xlabel(", ".join(r["columns"]))
        fig.tight_layout()
        fig.savefig(png, dpi=110)
        plt.close(fig)
        parts.append(_section(r, png))
    page = out / "report.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>Release report</title>"
        "<style>body{font-family:sans-serif;max-width:760px;margin:2em auto}section{margin-bottom:2em}</style>"
        f"</head><body><h1>Release {html.escape(run)}</h1><p>{html.escape(rows[0]['job_name'])} on "
        f"{html.escape(rows[0]['dataset'])}, {rows[0]['created_at']}</p>{''.join(parts)}</body></html>"
    )
    return page
