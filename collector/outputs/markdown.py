"""report.md and the terminal's report: within WIDTH columns (`wide`: every table whole, and the full table too),
the hosts' environment, the hand-run style lines, per host and tp a row per cell with a column per method, then the
checks that did not pass, the pack check, the spread across hosts and engines, DDTree against DFlash, the acceptance
per config and the time per config."""
from __future__ import annotations

from typing import Any

import pandas as pd

from .. import crossover
from ..environment import environment
from ..mdtable import pipe_rows, pipe_table
from ..results import Run
from ..tables import PAIR, row_dicts
from ..tables.acceptance import INTERVAL, acceptance
from ..tables.acceptance import WHAT as ACCEPTANCE
from ..tables.cross_host import cross_host
from ..tables.ddtree_vs_dflash import NO_OVERLAP_FLAG, ddtree_vs_dflash, dflash_alone
from ..tables.pack_check import pack_check
from ..tables.timing import STARTUP_PHASES, WHAT, timing
from ..views import AR, KEYS, WIDTH, by_budget, by_workload, config_order, fit_rows, outcomes, wrap
from ..vocab import CELL, cell_words, fixed, load_words, na, ratio_words, tok_words


def _text(text: str, wide: bool, indent: str = "") -> list[str]:
    """A paragraph or list item: one line when wide, else wrapped to WIDTH (views.wrap)."""
    return [text] if wide else wrap(text, WIDTH, indent)


def _table(rows: list[dict[str, str]], keys: list[str], wide: bool) -> list[str]:
    """A pipe table of the rows: whole when wide, else split by columns to fit WIDTH, `keys` in every part."""
    return pipe_rows(rows).splitlines() if wide else fit_rows(rows, keys, WIDTH)


def pack_markdown(checked: pd.DataFrame, wide: bool = True) -> list[str]:
    """The pack checks in markdown: what each one measured beside, then one row per cell; nothing at all when the
    run has none. Not `wide`: fits WIDTH columns."""
    if checked.empty:
        return []
    md = ["## Baseline alone vs packed", "",
          *_text("Each packed phase's baseline is measured alone, then again (the pack check) while the phase's other "
                 "configs run beside it on the other slots. Per cell: its tok/s alone and packed (mean ± sample std, "
                 "n) and packed ÷ alone with its 95% interval (as for the speedup). Below 1, running beside the others "
                 "slowed the baseline; the table's speedups are against the baseline measured alone.", wide), ""]
    found = row_dicts(checked)
    for r in {(r["host"], r["pack_check_config_id"]): r for r in found}.values():
        near = r["beside"] or "no other config was in its timed requests at the same time"
        md += _text(f"- {r['host']} `{r['pack_check_config_id']}` (`{r['baseline_config_id']}` measured again), "
                    f"measuring beside: {near}", wide)
    rows = []
    for r in found:
        rows.append({"host": str(r["host"]), "tp": "" if na(r["tp"]) else str(r["tp"]), "cell": cell_words(r),
                     "baseline": str(r["baseline_config_id"]),
                     "alone tok/s": tok_words(r["alone_tok_s_mean"], r["alone_tok_s_std"], r["alone_n"])
                     or str(r["alone_status"]),
                     "packed tok/s": tok_words(r["packed_tok_s_mean"], r["packed_tok_s_std"], r["packed_n"])
                     or str(r["packed_status"]),
                     "packed ÷ alone": ratio_words(r["packed_over_alone"], r["packed_over_alone_ci_low"],
                                                   r["packed_over_alone_ci_high"]),
                     "significant": str(r["packed_over_alone_significant"])})
    return md + ["", *_table(rows, ["host", "tp", "cell"], wide)]


def hand_run_lines(df: pd.DataFrame) -> list[str]:
    """Per config, one `fib: 26.4 ± 0.1 tok/s` line per cell, as the original hand-run printed; per host, configs
    by tp, then in budget_key's order."""
    lines = []
    several_lengths = len(set(df["max_tokens"].dropna())) > 1
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for r in row_dicts(df):
        if not na(r["host"]) and not na(r["config_id"]):  # as groupby() leaves them out
            groups.setdefault((r["host"], r["config_id"]), []).append(r)
    hosts = {h: i for i, h in enumerate(dict.fromkeys(h for h, _ in groups))}
    first = {key: g[0] for key, g in groups.items()}
    for host, cid in sorted(groups, key=lambda k: (hosts[k[0]], config_order(first[k]["tp"], first[k]["method"],
                                                                       first[k]["method_params"], k[1]))):
        g = groups[(host, cid)]
        lines.append(f"{host} {cid}:")
        for r in g:
            qual = []
            if several_lengths:
                qual.append(f"{r['max_tokens']} tok")
            if not pd.isna(r["context_tokens"]) and r["context_tokens"]:
                qual.append(f"ctx {r['context_tokens']}")
            if load_words(r):
                qual.append(load_words(r))
            workload = r["workload"] if isinstance(r["workload"], str) else "(unknown cell)"
            name = workload + (f" ({', '.join(qual)})" if qual else "")
            if r["status"] != "ok" or r["tok_s_mean"] is None or pd.isna(r["tok_s_mean"]):
                lines.append(f"  {name}: {r['status']}")
                continue
            std = r["tok_s_std"]
            text = f"  {name}: {r['tok_s_mean']:.1f} ± {0.0 if pd.isna(std) else std:.1f} tok/s"
            extra = [f"n={r['n']}"]
            if r["errors"]:
                extra.append(f"{r['errors']} errors")
            if r["method"] != "autoregressive" and not pd.isna(r["speedup"]):
                extra.append(f"{r['speedup']:.2f}x [{fixed(r['speedup_ci_low'])}, {fixed(r['speedup_ci_high'])}]")
            if not pd.isna(r["accept_length_mean"]):
                extra.append(f"accept {r['accept_length_mean']:.2f}")
            if not na(r["burst_tok_s_mean"]):
                extra.append(f"burst {r['burst_tok_s_mean']:.1f} tok/s")
            if r["flags"]:
                extra.append(f"[{r['flags']}]")
            lines.append(f"{text}  ({', '.join(extra)})")
    return lines


def vs_markdown(run: Run, vs: pd.DataFrame, wide: bool = True,
                alone: list[dict[str, Any]] | None = None) -> list[str]:
    """The DDTree-against-DFlash view in markdown: per table group one table, a row per DDTree config and a
    ratio column per DFlash config, then the DFlash configs with no DDTree beside them (`alone`: which engine
    measured them); nothing at all when the run has no DFlash config. Not `wide`: fits WIDTH
    columns."""
    alone = dflash_alone(run) if alone is None else alone
    if vs.empty and not alone:
        return []
    if vs.empty:
        return _alone_markdown(alone, wide)
    outcome_of = outcomes(run)

    def status_text(host: str, cid: str, status: Any) -> str:
        outcome = outcome_of.get((host, cid))
        return str(status) if outcome in (None, "ok", status) else f"{outcome}: {status}"

    several = len(vs[["engine", "model"]].drop_duplicates()) > 1
    md = ["## DDTree budgets against DFlash", "",
          *_text("Per host, tp and cell: each DDTree config's tok/s (mean ± sample std), its speedup over the baseline "
                 "and DDTree ÷ DFlash tok/s for every DFlash config, each ratio with its 95% interval (as for the "
                 "speedup). DDTree runs without overlap scheduling; *same path* marks the DFlash config that does too "
                 f"(`{NO_OVERLAP_FLAG}` in its server arguments, or an SGLang build up to 0.5.13, which runs "
                 "DFlash without overlap always).", wide)]
    groups: dict[int, list[dict[str, Any]]] = {}
    for g, r in zip(vs.groupby(PAIR, sort=False, dropna=False).ngroup().tolist(), row_dicts(vs)):
        groups.setdefault(g, []).append(r)  # numbered as they first appear
    for g in sorted(groups):
        k = groups[g][0]
        where = f" ({k['engine']}, {k['model']})" if several else ""
        md += ["", f"### {k['host']} tp{k['tp']}: {cell_words(k)}{where}", ""]
        columns = {}
        for f in groups[g]:
            if f["dflash_config_id"] in columns:
                continue
            same = f["same_path_as_ddtree"]
            path = ("scheduling path unknown" if na(same) else
                    "overlap off: same path as DDTree" if same else "overlap on")
            shown = tok_words(f["dflash_tok_s_mean"], f["dflash_tok_s_std"], f["dflash_n"], " tok/s")
            shown = shown or status_text(f["host"], f["dflash_config_id"], f["dflash_status"])
            md += _text(f"- DFlash `{f['dflash_config_id']}`: {shown}; {path}", wide)
            columns[f["dflash_config_id"]] = f"÷ {f['dflash_config_id']}" + (" (same path)" if same is True else "")
        trees: dict[Any, list[dict[str, Any]]] = {}
        for pair in groups[g]:
            trees.setdefault(pair["ddtree_config_id"], []).append(pair)
        rows = []
        for tid, pairs in trees.items():
            first = pairs[0]
            row = {"budget": "" if na(first["budget"]) else str(first["budget"]), "config_id": tid,
                   "tok/s": tok_words(first["ddtree_tok_s_mean"], first["ddtree_tok_s_std"], first["ddtree_n"]),
                   "speedup": ratio_words(first["speedup"], first["speedup_ci_low"], first["speedup_ci_high"])}
            for pair in pairs:
                row[columns[pair["dflash_config_id"]]] = ratio_words(
                    pair["ddtree_over_dflash"], pair["ddtree_over_dflash_ci_low"], pair["ddtree_over_dflash_ci_high"])
            row["status"] = status_text(first["host"], tid, first["ddtree_status"])
            rows.append(row)
        md += ["", *_table(rows, ["budget", "config_id"], wide)]
    return md + (["", *_alone_markdown(alone, wide)[2:]] if alone else [])


def _alone_markdown(alone: list[dict[str, Any]], wide: bool) -> list[str]:
    """The DFlash configs measured with no DDTree config beside them: which, and which engine measured them."""
    md = ["## DDTree budgets against DFlash", "",
          *_text("No DDTree config was measured beside these DFlash configs (DDTree runs on SGLang with its patch); "
                 "their rows are in the speedup table above, measured by:", wide)]
    for a in alone:
        engine = f"{a['engine']} {a['engine_version']}" if a.get("engine_version") else str(a["engine"])
        md += _text(f"- {a['host']} `{a['config_id']}` (tp{a['tp']}): {engine}", wide)
    return md


def _ms(v: Any) -> str:
    return "" if na(v) else f"{v * 1000:.0f}"


def pays_markdown(df: pd.DataFrame, pays: pd.DataFrame, wide: bool) -> list[str]:
    """Where speculation pays (collector.crossover): per host and tp, a row per config and cell swept over two
    loads or more; then each such load's throughput, latency percentiles and goodput. Nothing without a sweep."""
    if pays.empty:
        return []
    md = ["## Where speculation pays", "",
          *_text("Per cell swept over loads (closed-loop concurrency cN, or open-loop request rates): a config's best "
                 "throughput ratio to the baseline (output tok/s over all of a load's requests; 95% interval in the "
                 "load table below), the loads where it is above 1, and the crossover: the load where the ratio "
                 "falls below 1, interpolated linearly between the measured loads around it, with the loads where "
                 "its interval's bounds cross 1 (docs/serving.md). With latency limits, the same for goodput (the "
                 "output tok/s of requests within every limit) and the highest load whose requests meet the limits "
                 "in the share asked.", wide)]
    for (host, tp), group in pays.groupby(["host", "tp"], sort=False, dropna=False):
        rows = []
        for r in row_dicts(group):
            row = {"config": str(r["config_id"]), "cell": cell_words(r, leave_out="concurrency"),
                   "loads": str(r["loads"])}
            if r["method"] != "autoregressive":
                row.update({"best": "" if na(r["best_speedup"]) else f"{r['best_speedup']:.2f}x at {r['best_at']}",
                            "pays at": str(r["pays_at"] or ""), "crossover": str(r["crossover_text"] or "")})
            else:
                row.update({"best": "(baseline)", "pays at": "", "crossover": ""})
            if group["slo"].notna().any():
                row["goodput crossover"] = "" if na(r["goodput_crossover_text"]) else str(r["goodput_crossover_text"])
                row["within limits up to"] = "" if na(r["max_load_within_slo"]) else str(r["max_load_within_slo"])
            if not na(r["not_measured"]):
                row["not measured"] = str(r["not_measured"])
            rows.append(row)
        keys = ["config", "cell"]
        rows = [{k: r.get(k, "") for k in dict.fromkeys(k for r in rows for k in r)} for r in rows]
        md += ["", f"### {host} tp{'?' if na(tp) else tp}", "", *_table(rows, keys, wide)]
        limits = sorted({str(x) for x in group["slo"].dropna()})
        if limits:
            md += ["", *_text("Latency limits: " + "; ".join(crossover.slo_text(x) for x in limits), wide)]
    md += ["", "### Per load: throughput, latency and goodput", "",
           *_text("Each load of those sweeps: output tok/s over all its requests (mean over repetitions) and its ratio "
                  "to the baseline with the 95% interval; p50/p90/p99 of TTFT and p90 of TPOT and e2e in ms; for an "
                  "open-loop load the rate the client achieved; with limits, the share of requests within them and "
                  "goodput in tok/s. Under speculation a stream chunk carries a verify step's tokens: the per-token "
                  "ITL looks smooth while a reader waits a whole step between chunks, so the ITL limit is checked "
                  "against the longest wait between chunks.", wide), ""]
    swept = {(r["host"], r["tp"], r["workload"], r["max_tokens"], r["context_tokens"], r["config_id"], r["axis"])
             for r in row_dicts(pays)}
    rows = []
    for r in row_dicts(df):
        axis = "concurrency" if na(r["request_rate"]) else "request_rate"
        if (r["host"], r["tp"], r["workload"], r["max_tokens"], r["context_tokens"], r["config_id"], axis) not in swept:
            continue
        one = r["concurrency"] == 1 and axis == "concurrency"
        tput, ratio = (r["tok_s_mean"], (r["speedup"], r["speedup_ci_low"], r["speedup_ci_high"])) if one else (
            r["burst_tok_s_mean"], (r["burst_speedup"], r["burst_speedup_ci_low"], r["burst_speedup_ci_high"]))
        row = {"host": str(r["host"]), "tp": "" if na(r["tp"]) else str(r["tp"]), "cell": cell_words(r),
               "config": str(r["config_id"]),
               "tok/s": "" if na(tput) else f"{tput:.1f}" if r["status"] == "ok" else str(r["status"]),
               "÷ baseline": "" if r["method"] == "autoregressive" else ratio_words(*ratio),
               "TTFT p50/p90/p99": "/".join(_ms(r[f"ttft_p{q}_s"]) for q in (50, 90, 99)) if r["n"] else "",
               "TPOT p90": _ms(r["tpot_p90_s"]), "e2e p90": _ms(r["e2e_p90_s"])}
        if not na(r["request_rate"]):
            row["achieved req/s"] = "" if na(r["achieved_rate"]) else f"{r['achieved_rate']:.2f}"
        if not na(r["slo"]):
            row["within limits"] = "" if na(r["slo_met"]) else f"{r['slo_met'] * 100:.0f}%"
            row["goodput tok/s"] = fixed(r["goodput_tok_s"], 1)
        rows.append(row)
    columns = list(dict.fromkeys(k for r in rows for k in r))
    rows = [{k: r.get(k, "") for k in columns} for r in rows]
    return md + _table(rows, ["host", "tp", "cell", "config"], wide)


def environment_markdown(run: Run, wide: bool) -> list[str]:
    """Per host, what it was measured on (environment.environment), as one list item; nothing when nothing is
    known. Not `wide`: an item is wrapped between its facts where it can be."""
    env = {host: pairs for host, pairs in environment(run).items() if pairs}
    if not env:
        return []
    md = ["## Environment", ""]
    for host, pairs in env.items():
        facts = [f"{label} {value}" for label, value in pairs]
        if wide or any(len(f) > WIDTH // 2 for f in facts):
            md += _text(f"- {host}: " + "; ".join(facts), wide)
            continue
        glued = [f.replace(" ", "\N{NO-BREAK SPACE}") for f in facts]  # a line breaks between facts only
        md += [line.replace("\N{NO-BREAK SPACE}", " ") for line in wrap(f"- {host}: " + "; ".join(glued), WIDTH, "")]
    return md + [""]


def methods_markdown(run: Run, df: pd.DataFrame, wide: bool) -> list[str]:
    """The main table (views.by_workload): per host and tp, a row per cell and a column per config that measures
    any of its cells. Not `wide`: each split by columns to fit WIDTH, the cell in every part."""
    view = by_workload(df, outcomes(run))
    labels = [c for c in view.columns if c not in KEYS]
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for r in row_dicts(view):
        groups.setdefault((r["host"], r["tp"]), []).append(r)
    if not groups:
        return []
    md = [*_text("Per host and tp, a row per cell and a column per config: tok/s (the mean over ok requests) and "
                 f"its speedup over the autoregressive baseline ({AR}), or why there is no number.", wide)]
    for (host, tp), recs in groups.items():
        shown = [lab for lab in labels if any(r[lab] for r in recs)]
        rows = [{"cell": cell_words(r), **{lab: r[lab] for lab in shown}} for r in recs]
        md += ["", f"### {host} tp{'?' if na(tp) else tp}", "", *_table(rows, ["cell"], wide)]
    return md


def full_markdown(df: pd.DataFrame) -> list[str]:
    """Every column of the table but the engine, model, method, params and checks, its configs in budget order."""
    shown = by_budget(df)
    for col in ("tok_s_mean", "tok_s_std", "speedup", "speedup_ci_low", "speedup_ci_high", "accept_length_mean",
                "cv", "burst_tok_s_mean", "burst_speedup", "burst_speedup_ci_low", "burst_speedup_ci_high"):
        shown[col] = shown[col].map(fixed)
    for col in ("ttft_mean_s", "tpot_mean_s"):
        shown[col] = shown[col].map(lambda v: fixed(v, 3))
    return [pipe_table(shown.drop(columns=["engine", "model", "method", "method_params", "checks"]))]


def cross_host_markdown(df: pd.DataFrame, wide: bool) -> list[str]:
    """cross_host(df), its configs in budget order; nothing with fewer than two hosts and engines. Not `wide`: the
    cell in one column, split by columns to fit WIDTH."""
    hosts = cross_host(df)
    if hosts.empty:
        return []
    first = df.drop_duplicates("config_id").set_index("config_id")
    order = {cid: config_order(r["tp"], r["method"], r["method_params"], str(cid)) for cid, r in first.iterrows()}
    position = sorted(range(len(hosts)), key=lambda i: (order[hosts["config_id"].iat[i]], i))
    hosts = hosts.iloc[position].reset_index(drop=True)
    md = ["## Across hosts and engines", "",
          *_text("Per config and cell, the hosts and their engines side by side (two engines on one machine are two "
                 "hosts), a column each named `host (engine)`: its tok/s, then its speedup over that host's own "
                 "baseline; tok_s_spread is max ÷ min − 1 of their tok/s.", wide), ""]
    if wide:
        return md + [pipe_table(hosts, floatfmt=".2f")]
    rows = [{"config_id": str(r["config_id"]), "cell": cell_words(r),
             **{k: fixed(v) for k, v in r.items() if k not in ("config_id", *CELL)}} for r in row_dicts(hosts)]
    return md + _table(rows, ["config_id", "cell"], wide)


def timing_markdown(run: Run, wide: bool) -> list[str]:
    """timing(run) in markdown, each time column defined above it (timing.WHAT); nothing for a run without configs.
    Not `wide`: split by columns to fit WIDTH."""
    t = timing(run)
    if t.empty:
        return []
    md = ["## Time per config (seconds)", ""]
    for column, what in WHAT.items():
        md += _text(f"- {column}: {what}", wide)
    md += ["", *_text("A blank: the config did not record it.", wide), ""]
    if any(c.endswith("_s") and c.split("_s")[0] in STARTUP_PHASES for c in t.columns):
        md += _text("Startup, from each server's log: the seconds from launch at which its weights were loaded "
                    "(weights_s), its model compiled (compile_s), its KV cache allocated (kv_cache_s) and its graphs "
                    "captured (graphs_s).", wide) + [""]
    if wide:
        return md + [pipe_table(t, floatfmt=".1f")]
    rows = [{k: fixed(v, 1) for k, v in r.items()} for r in row_dicts(t)]
    return md + _table(rows, ["host", "config_id"], wide)


def acceptance_markdown(run: Run, wide: bool) -> list[str]:
    """acceptance(run) in markdown: each figure defined (acceptance.WHAT), each config's method and parameters as a
    list item (a column of them would not fit WIDTH beside a long config id), then a row per config, the acceptance
    length with its interval in one column (as the speedup is); nothing for a run without a speculative config. Not
    `wide`: split by columns to fit WIDTH."""
    t = acceptance(run)
    if t.empty:
        return []
    md = ["## Acceptance per config", "",
          *_text("Per speculative config, over its ok timed requests, from each request's verify steps (spec_steps), "
                 "accepted draft tokens (spec_accepted_tokens) and drafted tokens (spec_draft_tokens) as the server "
                 "counted them:", wide)]
    for column, what in ACCEPTANCE.items():
        md += _text(f"- {column}: {what}" + (f"; in brackets, {INTERVAL}" if column == "accept_length" else ""), wide)
    md += ["", *_text("A blank: the config's requests do not carry what the figure takes. The configs, each with its "
                      "method and parameters:", wide)]
    found = row_dicts(t)
    for r in found:
        md += _text(f"- {r['host']} `{r['config_id']}`: {', '.join(x for x in (r['method'], r['params']) if x)}", wide)
    rows = [{"host": str(r["host"]), "config_id": str(r["config_id"]), "requests": str(r["requests"]),
             "requests_with_steps": str(r["requests_with_steps"]),
             "accept_length": ratio_words(r["accept_length"], r["accept_length_ci_low"], r["accept_length_ci_high"]),
             "acceptance_rate": fixed(r["acceptance_rate"], 3),
             "draft_tokens_per_step": fixed(r["draft_tokens_per_step"], 2), "burst_rows": str(r["burst_rows"]),
             "counters": "" if na(r["counters"]) else str(r["counters"])} for r in found]
    return md + ["", *_table(rows, ["host", "config_id"], wide)]


def render(run: Run, df: pd.DataFrame, wide: bool = False) -> str:
    """The report in markdown from the speedup table `df` (tables.speedup.table): within WIDTH columns, its main
    table the methods as columns per cell; `wide` adds the full table and lays every table out whole."""
    seed = hand_run_lines(df)
    md = [f"# Run {run.meta.get('run_id', run.root.name)}", "", *environment_markdown(run, wide)]
    md += ["```", *(seed if wide else [part for line in seed for part in wrap(line, WIDTH)]), "```", ""]
    md += ["## Speedup vs the autoregressive baseline", "", *methods_markdown(run, df, wide)]
    if wide:
        md += ["", "## Every column", "", *full_markdown(df)]
    checked = row_dicts(df[df["checks"].astype(bool)].drop_duplicates(["host", "config_id"]))
    if checked:
        packed = any("packed" in r["flags"].split(",") for r in checked)
        md += ["", "## Checks that did not pass" + (", and packing" if packed else ""), ""]
        for r in sorted(checked, key=lambda r: (r["host"], config_order(r["tp"], r["method"], r["method_params"],
                                                                  r["config_id"]))):
            md += _text(f"- {r['host']} {r['config_id']} [{r['flags']}]: {r['checks']}", wide)
    for section in (pays_markdown(df, crossover.table(df), wide), pack_markdown(pack_check(run), wide),
                    cross_host_markdown(df, wide),
                    vs_markdown(run, ddtree_vs_dflash(run, df), wide, dflash_alone(run, df)),
                    acceptance_markdown(run, wide), timing_markdown(run, wide)):
        if section:
            md += ["", *section]
    if run.problems:  # each whole on its line, for the file (and line) it names
        md += ["", "## Problems in the results (skipped)", "", "```", *[f"- {p}" for p in run.problems], "```"]
    return "\n".join(md) + "\n"
