"""The web console in headless Chromium: first paint, "ready" and graph render on a
1,000-table topology, against a 5-table topology measured in the same run.

    .venv/bin/python -m bench.bench_console [--reps 5] [--out bench/results/console.json]

Two services run side by side, each on real HTTP (uvicorn in a thread of this process,
on a manual clock, SQLite), with the UI tests' own topologies (``tests/ui/topologies``):
``wide``, 100 jobs writing 10 tables each (1,000 tables), and ``warehouse`` (5 jobs,
5 tables). Each repetition opens ``/ui/`` of the small one, then of the large one, in a
fresh browser context (empty cache), and measures, all in the page with the Performance
API:

- ``first_paint``, ``first_contentful_paint``: ``performance.getEntriesByType('paint')``;
- ``dom_content_loaded``: the navigation entry's ``domContentLoadedEventEnd``;
- ``ready``: the console set ``body[data-loaded]`` (topology read from the API and the
  start page rendered), marked by a MutationObserver; ``api_topology`` is the span of
  the console's ``/jobs`` and ``/tables`` requests (resource timing);
- ``search_suggestions``: from the search box's ``input`` event to the matching
  suggestion in the list;
- ``focus_drawn``: from Enter in the search box to the first animation frame whose graph
  holds the table's 2-hop neighbourhood (laid out by dagre);
- ``critical_drawn``: from Enter to the first frame with the table's critical path (read
  from ``/delay``) highlighted up to a source job: the whole "search and show" step;
- ``all_connected_drawn`` (large topology only): from choosing "everything connected"
  to the frame that draws it (hundreds of nodes through dagre).

Marks taken in animation frames are frame-granular (about 16.7 ms).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.common import host_facts, loadavg, package_version, percentile
from tests.ui.conftest import Service, chromium_path
from tests.ui.topologies import warehouse, wide

# Installed before any of the console's scripts: a mark when the console says it is
# ready, and long tasks (main-thread work over 50 ms) for the record.
INIT_SCRIPT = """
(() => {
  const mark = (name) => {
    if (!performance.getEntriesByName(name, "mark").length) performance.mark(name);
  };
  window.__bench = { mark, longTasks: [] };
  new MutationObserver(() => {
    if (document.body && document.body.dataset.loaded) mark("ready");
  }).observe(document, { attributes: true, subtree: true, attributeFilter: ["data-loaded"] });
  try {
    new PerformanceObserver((list) => {
      for (const e of list.getEntries()) window.__bench.longTasks.push([e.startTime, e.duration]);
    }).observe({ type: "longtask", buffered: true });
  } catch (e) {}
})();
"""

# Watches one search-and-focus: marks on the search box's input and Enter, on the
# suggestion's arrival, and on the first frames that draw the focus and the critical path.
WATCH_SEARCH = """
([target, criticalRe]) => {
  for (const m of ["search-input", "suggestions", "enter", "focus-drawn", "critical-drawn"])
    performance.clearMarks(m);
  const mark = window.__bench.mark;
  const box = document.getElementById("search");
  box.addEventListener("input", () => mark("search-input"), { capture: true, once: true });
  box.addEventListener("keydown", (e) => { if (e.key === "Enter") mark("enter"); }, { capture: true });
  const list = document.getElementById("suggestions");
  const seen = () => list.querySelector(`li[data-name="${target}"]`);
  const obs = new MutationObserver(() => { if (seen()) { mark("suggestions"); obs.disconnect(); } });
  obs.observe(list, { childList: true, subtree: true });
  const re = new RegExp(criticalRe);
  const frame = () => {
    const entered = performance.getEntriesByName("enter", "mark").length > 0;
    if (entered && window.metaConsole.drawnNodes().includes(`table:${target}`)) mark("focus-drawn");
    if (entered && window.metaConsole.criticalNodes().some((n) => re.test(n))) {
      mark("critical-drawn");
      return;
    }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}
"""

WATCH_REDRAW = """
(before) => {
  performance.clearMarks("hops-changed");
  performance.clearMarks("hops-drawn");
  const mark = window.__bench.mark;
  document.getElementById("hops").addEventListener(
    "change", () => mark("hops-changed"), { capture: true, once: true });
  const frame = () => {
    if (window.metaConsole.drawnNodes().length > before) { mark("hops-drawn"); return; }
    requestAnimationFrame(frame);
  };
  requestAnimationFrame(frame);
}
"""

COLLECT_LOAD = """
() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const paint = Object.fromEntries(
    performance.getEntriesByType("paint").map((e) => [e.name, e.startTime]));
  const ready = performance.getEntriesByName("ready", "mark")[0];
  const api = performance.getEntriesByType("resource")
    .filter((e) => /\\/api\\/v1\\/(jobs|tables)\\?/.test(e.name));
  const scripts = performance.getEntriesByType("resource")
    .filter((e) => e.initiatorType === "script");
  return {
    first_paint: paint["first-paint"] ?? null,
    first_contentful_paint: paint["first-contentful-paint"] ?? null,
    dom_content_loaded: nav.domContentLoadedEventEnd,
    load_event: nav.loadEventEnd,
    ready: ready ? ready.startTime : null,
    api_topology: api.length
      ? Math.max(...api.map((e) => e.responseEnd)) - Math.min(...api.map((e) => e.startTime))
      : null,
    api_topology_bytes: api.reduce((s, e) => s + (e.encodedBodySize || 0), 0),
    scripts_loaded: scripts.length ? Math.max(...scripts.map((e) => e.responseEnd)) : null,
    long_tasks_ms: window.__bench.longTasks.reduce((s, t) => s + t[1], 0),
    longest_task_ms: Math.max(0, ...window.__bench.longTasks.map((t) => t[1])),
  };
}
"""

API_DELAY = """
() => {
  const d = performance.getEntriesByType("resource").filter((e) => /\\/api\\/v1\\/delay\\?/.test(e.name));
  return d.length ? d[d.length - 1].duration : null;
}
"""

# Main-thread work (long tasks, over 50 ms each) since a mark: layout and drawing.
LONG_TASKS_SINCE = """
(name) => {
  const m = performance.getEntriesByName(name, "mark")[0];
  return window.__bench.longTasks.filter((t) => t[0] >= m.startTime).reduce((s, t) => s + t[1], 0);
}
"""

SPAN = """
([a, b]) => {
  const s = performance.getEntriesByName(a, "mark")[0], e = performance.getEntriesByName(b, "mark")[0];
  return s && e ? e.startTime - s.startTime : null;
}
"""

# What to search on each topology, the table the search should find, and a pattern of
# the source job its critical path must reach.
CASES = {
    "small": {"query": "order_detail", "table": "dwd.order_detail", "critical": "^job:items_src$"},
    "large": {"query": "t030_1", "table": "db2.t030_1", "critical": "^job:job00\\d$"},
}


def one_visit(browser: Any, url: str, case: dict[str, str], all_connected: bool) -> dict[str, Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.add_init_script(INIT_SCRIPT)
    try:
        page.goto(url + "/ui/")
        page.wait_for_selector("body[data-loaded]", timeout=30_000)
        page.wait_for_function("() => performance.getEntriesByName('ready', 'mark').length > 0")
        row: dict[str, Any] = page.evaluate(COLLECT_LOAD)
        row["drawn_at_start"] = len(page.evaluate("() => window.metaConsole.drawnNodes()"))

        page.evaluate(WATCH_SEARCH, [case["table"], case["critical"]])
        page.fill("#search", case["query"])
        page.wait_for_selector(f"#suggestions li[data-name='{case['table']}']")
        page.press("#search", "Enter")
        page.wait_for_function(
            "() => performance.getEntriesByName('critical-drawn', 'mark').length > 0",
            timeout=30_000,
        )
        row["search_suggestions"] = page.evaluate(SPAN, ["search-input", "suggestions"])
        row["focus_drawn"] = page.evaluate(SPAN, ["enter", "focus-drawn"])
        row["critical_drawn"] = page.evaluate(SPAN, ["enter", "critical-drawn"])
        row["drawn_in_focus"] = len(page.evaluate("() => window.metaConsole.drawnNodes()"))
        row["api_delay"] = page.evaluate(API_DELAY)
        row["long_tasks_after_enter_ms"] = page.evaluate(LONG_TASKS_SINCE, "enter")

        if all_connected:
            before = row["drawn_in_focus"]
            page.evaluate(WATCH_REDRAW, before)
            page.select_option("#hops", "all")
            page.wait_for_function(
                "() => performance.getEntriesByName('hops-drawn', 'mark').length > 0",
                timeout=60_000,
            )
            row["all_connected_drawn"] = page.evaluate(SPAN, ["hops-changed", "hops-drawn"])
            row["long_tasks_after_hops_ms"] = page.evaluate(LONG_TASKS_SINCE, "hops-changed")
            row["drawn_all_connected"] = len(page.evaluate("() => window.metaConsole.drawnNodes()"))
    finally:
        context.close()
    row["page_errors"] = errors
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}


TIMED = [
    "first_paint",
    "first_contentful_paint",
    "dom_content_loaded",
    "ready",
    "api_topology",
    "search_suggestions",
    "focus_drawn",
    "api_delay",
    "critical_drawn",
    "all_connected_drawn",
]


def api_from_python(svc: Service, reps: int = 5) -> dict[str, float]:
    """The console's topology reads timed from here (httpx, keep-alive): the service's
    share of ``api_topology``, median ms."""
    out = {}
    for path in ("/api/v1/tables", "/api/v1/jobs"):
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            r = svc.http.get(path, params={"limit": 1000, "offset": 0})
            times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200, r.text
        out[path] = round(statistics.median(times), 1)
    return out


def statements_of_topology_reads(db_url: str, clock: Any) -> dict[str, int]:
    """SQL statements of the console's two topology reads (a page of 1,000), by the
    service functions the endpoints call, on the benchmark's own database."""
    from sqlalchemy import event

    from metaservice.context import Context
    from metaservice.db import Database
    from metaservice.settings import Settings
    from metaservice.topology import views as topology

    db = Database(db_url)
    ctx = Context(settings=Settings(db_url=db_url), clock=clock)
    count = [0]
    event.listen(db.engine, "before_cursor_execute", lambda *_: count.__setitem__(0, count[0] + 1))
    out = {}
    try:
        for path, read in (
            ("/api/v1/tables", topology.list_tables),
            ("/api/v1/jobs", topology.list_jobs),
        ):
            before = count[0]
            db.read(partial(read, ctx=ctx, limit=1000, offset=0))
            out[path] = count[0] - before
    finally:
        db.dispose()
    return out


def summary(reps: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for key in TIMED:
        values = [r[key] for r in reps if r.get(key) is not None]
        if values:
            out[key] = {
                "p50": round(statistics.median(values), 1),
                "p90": round(percentile(values, 90), 1),
                "min": min(values),
                "max": max(values),
            }
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=5, help="visits of each topology")
    parser.add_argument("--out", default="bench/results/console.json")
    args = parser.parse_args(argv)

    from playwright.sync_api import sync_playwright

    path = chromium_path()
    if path is None:
        sys.exit("Debian's chromium is not installed (make install installs it)")
    started = time.time()
    load_before = loadavg()
    print(f"load average {load_before}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-console-") as root, ExitStack() as stack:
        services = {}
        t0 = time.perf_counter()
        for name, build in (("small", warehouse), ("large", wide)):
            svc = stack.enter_context(Service(f"sqlite:///{Path(root) / name}.db"))
            build(svc.http, svc.clock)
            services[name] = svc
        setup_s = time.perf_counter() - t0
        sizes = {
            name: {
                "tables": svc.http.get("/api/v1/tables", params={"limit": 1}).json()["total"],
                "jobs": svc.http.get("/api/v1/jobs", params={"limit": 1}).json()["total"],
            }
            for name, svc in services.items()
        }
        print(f"topologies {sizes} built in {setup_s:.1f} s", flush=True)
        api_ms = {name: api_from_python(svc) for name, svc in services.items()}
        statements = {
            name: statements_of_topology_reads(f"sqlite:///{Path(root) / name}.db", svc.clock)
            for name, svc in services.items()
        }
        print(f"topology reads from Python: {api_ms} ms, {statements} statements", flush=True)
        p = stack.enter_context(sync_playwright())
        browser = p.chromium.launch(executable_path=path, headless=True)
        stack.callback(browser.close)
        for name in ("small", "large"):  # warm-up: the services' first reads, the browser
            one_visit(browser, services[name].url, CASES[name], False)
        reps: dict[str, list[dict[str, Any]]] = {"small": [], "large": []}
        for i in range(args.reps):
            for name in ("small", "large"):
                row = one_visit(browser, services[name].url, CASES[name], name == "large")
                row["load_1min"] = loadavg()[0]
                reps[name].append(row)
                print(
                    f"  {i + 1}/{args.reps} {name}: FCP {row['first_contentful_paint']} ms, "
                    f"ready {row['ready']} ms, search+focus {row['critical_drawn']} ms"
                    + (
                        f", everything connected ({row['drawn_all_connected']} nodes) "
                        f"{row['all_connected_drawn']} ms"
                        if "all_connected_drawn" in row
                        else ""
                    ),
                    flush=True,
                )
        browser_version = browser.version
    load_after = loadavg()
    summaries = {name: summary(rows) for name, rows in reps.items()}
    ratios = {
        key: round(summaries["large"][key]["p50"] / summaries["small"][key]["p50"], 2)
        for key in TIMED
        if key in summaries["small"]
        and key in summaries["large"]
        and summaries["small"][key]["p50"]
    }
    result = {
        "benchmark": "console",
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "host": host_facts(),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "versions": {
            "chromium": browser_version,
            **{p: package_version(p) for p in ("playwright", "fastapi", "uvicorn", "sqlalchemy")},
        },
        "unit": "ms, from the page's performance timeline",
        "topologies": sizes,
        "searches": CASES,
        "api_from_python_ms": api_ms,
        "api_statements": statements,
        "reps": reps,
        "summary": summaries,
        "ratio_large_to_small_p50": ratios,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for key in TIMED:
        s, la = summaries["small"].get(key), summaries["large"].get(key)
        if la:
            small = f"{s['p50']:>7} / {s['p90']:>7}" if s else f"{'-':>17}"
            print(f"  {key:<24} small {small}   large {la['p50']:>7} / {la['p90']:>7} ms")
    print(f"load average {load_before} -> {load_after}; written to {args.out}")


if __name__ == "__main__":
    main()
