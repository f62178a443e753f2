"""benchfs-analyze end to end: a real small run's directory, the CLI (terminal, JSON, CSV,
baseline, Chrome trace, --save), the HTML report in headless Chromium, the notebooks executed
with nbclient, and `benchfs-bench analysis --quick`."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from click.testing import CliRunner
from nbclient import NotebookClient
from PIL import Image

from benchfs import analysis as A
from benchfs import schemas
from benchfs.analysis.report import SECTIONS, change_label, render_html
from benchfs.bench import analysis as analysis_bench
from benchfs.cli.analyze import main as analyze_main
from conftest import benchfs_run_command, rendered
from synth_run import ClientSpec, make_run, ms
from test_analysis import TH, cluster, healthy_clients, healthy_iostat

# Run alone, after the parallel part of make test-python:
# its runs are traced (bpftrace, perf over the whole host) and checked for silence.
pytestmark = pytest.mark.serial


REPO = Path(__file__).resolve().parent.parent
# darshan.ipynb needs a run traced by Darshan: tests/test_darshan.py runs it.
NOTEBOOKS = sorted(p for p in (REPO / "notebooks").glob("*.ipynb") if p.name != "darshan.ipynb")
FILE_SIZE = 16 << 20
CHUNK = 65536


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("BENCHFS_")}


def _real_run(root: Path, *overrides: str) -> Path:
    argv = [
        *benchfs_run_command(), "launch", "--servers", "2", "--clients", "2",
        "--file-size", str(FILE_SIZE), "--transfer-size", "256K",
        "--set", f"layout.chunk_size={CHUNK}", "--set", "telemetry.interval_ms=200",
        "--results-root", str(root), "--json",
        *(x for o in overrides for x in ("--set", o)),
    ]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=180, env=_clean_env(), check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(json.loads(done.stdout)["results_dir"])


@pytest.fixture(scope="session")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real `benchfs-run launch` (2 servers, 2 clients, 16 MiB each in 64 KiB chunks)."""
    return _real_run(tmp_path_factory.mktemp("analysis-run"))


@pytest.fixture(scope="session")
def baseline_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another real run with a different configuration (for --baseline), and thresholds of
    its own (every operation is slow; a node's read latency must rise 7-fold)."""
    return _real_run(
        tmp_path_factory.mktemp("analysis-baseline"),
        "storage.handle_cache=64",
        "insights.slow_op_ms=1e-6",
        "diagnose.rise_ratio=7",
    )


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def analyze_cli(*args: str, check: bool = True) -> Done:
    """benchfs-analyze in this process (click's runner: no interpreter start per call)."""
    result = CliRunner().invoke(analyze_main, list(args), catch_exceptions=False)
    done = Done(result.exit_code, result.stdout, result.stderr)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_console_script_runs(real_run: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.analyze", str(real_run), "--json"],
        capture_output=True, text=True, timeout=120, env=_clean_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["summary"]["run"] == real_run.name


def test_real_run_tables_and_silent_insights(real_run: Path) -> None:
    a = A.analyze(real_run, TH)
    data_ops = 2 * 2 * FILE_SIZE // CHUNK  # 2 clients write and read 16 MiB each
    t = a.tables
    assert t.per_node["ops"].sum() == data_ops
    assert sorted(t.per_node["node"]) == ["local-0", "local-1"]
    assert (t.per_node["mean_ms"] > 0).all() and (
        t.per_node["p99_ms"] >= t.per_node["p50_ms"]
    ).all()
    assert t.placement["write_bytes"].sum() == 2 * FILE_SIZE
    assert t.placement["write_ops"].sum() == data_ops // 2
    assert t.op_time.set_index("op").loc["all", "ops"] == data_ops
    assert t.op_time[[label for label, _, _ in A.OP_TIME_RANGES]].sum(axis=1).round(9).eq(1).all()
    depth = t.io_depth.set_index("node").loc["all"]
    assert depth["submits"] >= data_ops and 1 <= depth["mean"] <= depth["max"]
    assert t.timeseries["ops"].sum() == pytest.approx(data_ops)
    assert set(t.slow_nodes["node"]) == {"local-0", "local-1"}
    # Whole, if a node is judged slow: the judgment's own grounds and evidence.
    assert not t.slow_nodes["slow"].any(), t.slow_nodes.to_string()
    summary = a.summary()
    assert summary["outcome"] == "ok" and summary["servers"] == 2 and summary["clients"] == 2
    assert summary["verified"] is True
    assert [i.id for i in a.fired] == [], [(i.id, i.evidence) for i in a.fired]
    assert {i.id for i in a.insights if not i.evaluated} <= {"BFS-004", "BFS-006", "BFS-009"}
    # The workload's clients wrote telemetry too: RPCs by target from real client files.
    assert A.NO_CLIENT_TELEMETRY not in a.notes
    rpc = t.rpc_by_target.set_index("target")
    assert sorted(rpc.index) == [0, 1] and rpc["requests"].sum() >= data_ops
    assert (rpc["retries"] == 0).all() and (rpc["p99_ms"] > 0).all()


def test_the_report_a_run_saves_shows_how_it_went(real_run: Path) -> None:
    """The run saves its report after its final manifest: outcome, clients, bandwidth and
    verification are the run's, as a later `benchfs-analyze` also says."""
    document = json.loads((real_run / "analysis" / "report.json").read_text())
    schemas.check(document, schemas.REPORT, "report.json")
    saved = document["summary"]
    manifest = json.loads((real_run / "manifest.json").read_text())
    schemas.check(manifest, schemas.MANIFEST, "manifest.json")
    assert saved["outcome"] == "ok" and manifest["outcome"]["status"] == "ok"
    assert saved["clients"] == 2 and saved["verified"] is True
    assert saved["write_mib_s"] == manifest["workload"]["write_mib_s"] > 0
    assert saved["read_mib_s"] == manifest["workload"]["read_mib_s"] > 0
    assert manifest["analysis"]["exit_status"] == 0
    html = (real_run / "analysis" / "report.html").read_text()
    assert "<th>outcome</th><td>ok</td>" in html


def test_cli_terminal_json_csv_and_save(real_run: Path, tmp_path: Path) -> None:
    out = analyze_cli(str(real_run)).stdout
    assert "insights: 0 fired of 13" in out and "per node" in out and "local-0" in out, out
    assert "RPC by target" in out  # the workload's clients wrote client telemetry
    report = json.loads(analyze_cli(str(real_run), "--json").stdout)
    assert set(report) >= {"summary", "insights", "tables", "notes", "thresholds"}
    assert [i["id"] for i in report["insights"]] == [f"BFS-{k:03d}" for k in range(1, 14)]
    assert len(report["tables"]["per_node"]) == 2
    csv_dir = tmp_path / "csv"
    analyze_cli(str(real_run), "--csv", str(csv_dir))
    names = {p.name for p in csv_dir.iterdir()}
    assert {"io_depth.csv", "per_node.csv", "placement.csv", "insights.csv"} <= names
    assert len((csv_dir / "per_node.csv").read_text().splitlines()) == 3
    assert (csv_dir / "rpc_by_target.csv").read_text().startswith("target,node,requests")
    for table in csv_dir.glob("*.csv"):  # floats with 6 significant digits, not 17
        for number in re.findall(r"\b\d+\.\d+", table.read_text()):
            significant = number.replace(".", "").lstrip("0")
            assert len(significant) <= 6, (table.name, number)
    analyze_cli(str(real_run), "--save")
    saved = real_run / "analysis"
    assert (saved / "report.html").is_file() and (saved / "tables" / "per_node.csv").is_file()
    assert json.loads((saved / "report.json").read_text())["summary"]["run"] == real_run.name
    # the thresholds come from the one configuration: --set reaches them
    hot = json.loads(
        analyze_cli(str(real_run), "--json", "--set", "insights.slow_op_ms=0.001").stdout
    )
    assert hot["thresholds"]["slow_op_ms"] == 0.001
    # every node is equally "slow": no node stands out
    assert "BFS-003" not in {i["id"] for i in hot["insights"] if i["fired"]}
    assert all(r["slow_pct"] > 99 for r in hot["tables"]["per_node"])


def test_cli_errors_are_clear(real_run: Path, tmp_path: Path) -> None:
    done = analyze_cli(str(real_run), "--chrome-trace", str(tmp_path / "t.json"), check=False)
    assert (
        done.returncode == 1
        and "error ENOENT" in done.stderr
        and "no per-operation trace" in done.stderr
    )
    broken = tmp_path / "broken"
    shutil.copytree(real_run, broken)
    (broken / "telemetry" / "server-0-w0.tel").write_bytes(b"NOTTELEM" + b"\0" * 64)
    done = analyze_cli(str(broken), check=False)
    assert done.returncode == 1 and "error EIO" in done.stderr and "bad magic" in done.stderr
    done = analyze_cli(str(real_run), "--set", "insights.nosuch=1", check=False)
    assert done.returncode == 1 and "unknown key insights.nosuch" in done.stderr
    # A directory that is not a run: one line, and --save writes nothing into it.
    other = tmp_path / "not-a-run"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    done = analyze_cli(str(other), "--save", check=False)
    assert done.returncode == 1 and "is not a results directory" in done.stderr
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_baseline_compares_figures_and_configs(real_run: Path, baseline_run: Path) -> None:
    report = json.loads(
        analyze_cli(str(real_run), "--json", "--baseline", str(baseline_run)).stdout
    )
    schemas.check(report, schemas.REPORT, "benchfs-analyze --json --baseline")
    diff = {r["key"]: (r["this"], r["baseline"]) for r in report["baseline"]["config_diff"]}
    assert diff["storage.handle_cache"] == (512, 64)
    # Where each run wrote always differs and says nothing: left out.
    assert not {"telemetry.dir", "cluster.registry_dir", "run.results_root"} & set(diff)
    metrics = {r["metric"] for r in report["baseline"]["comparison"]}
    assert {"write MiB/s", "read op p99 (ms)", "mean device depth"} <= metrics
    for r in report["baseline"]["comparison"]:
        if r["change"] is not None:
            ratio = r["change"] + 1
            assert r["change_label"] == change_label(ratio)
            assert (r["better"] is None) == (r["change"] == 0)
    assert change_label(1.38) == "+38.0%" and change_label(2.5) == "2.50x"
    assert change_label(0.25) == "0.25x (-75%)" and change_label(None) == "-"
    out = analyze_cli(str(real_run), "--baseline", str(baseline_run)).stdout
    assert "vs baseline" in out and "storage.handle_cache" in out


def test_a_run_is_judged_by_its_own_thresholds(
    baseline_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's saved analysis (written by the run itself), a later `benchfs-analyze`, the
    library and `benchfs-diagnose judge` all use the thresholds in the run's config.toml,
    whatever BENCHFS_* says now; only their own --config or --set change them."""
    saved = json.loads((baseline_run / "analysis" / "report.json").read_text())
    assert saved["thresholds"]["slow_op_ms"] == 1e-6
    assert all(r["slow_pct"] > 99 for r in saved["tables"]["per_node"])
    monkeypatch.setenv("BENCHFS_INSIGHTS_SLOW_OP_MS", "500")
    monkeypatch.setenv("BENCHFS_DIAGNOSE_RISE_RATIO", "9")
    again = json.loads(analyze_cli(str(baseline_run), "--json").stdout)
    assert again["thresholds"]["slow_op_ms"] == 1e-6
    assert A.analyze(baseline_run).thresholds.slow_op_ms == 1e-6
    told = json.loads(analyze_cli(str(baseline_run), "--json", "--set", "insights.slow_op_ms=3")
                      .stdout)  # fmt: skip
    assert told["thresholds"]["slow_op_ms"] == 3.0
    judged = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.diagnose", "judge", str(baseline_run), "--json"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert json.loads(judged.stdout)["thresholds"]["rise_ratio"] == 7.0
    assert again["judgment_thresholds"]["rise_ratio"] == 7.0  # the run's, as the judge's


def test_chrome_trace_export(tmp_path: Path) -> None:
    run = make_run(tmp_path, cluster(), trace=True)
    out = tmp_path / "trace.json"
    done = analyze_cli(str(run), "--chrome-trace", str(out), "--chrome-trace-limit", "1000")
    assert "1,000 of 3,200 operations" in done.stderr
    doc = json.loads(out.read_text())
    events = doc["traceEvents"]
    assert doc["otherData"]["truncated"] and doc["otherData"]["exported_ops"] == 1000
    begins = [e for e in events if e["ph"] == "b" and e["name"] in ("read", "write")]
    ends = [e for e in events if e["ph"] == "e" and e["name"] in ("read", "write")]
    assert len(begins) == len(ends) == 1000
    names = [e for e in events if e["ph"] == "M"]
    assert {e["args"]["name"] for e in names} >= {"server 0 (node-0)"}
    first = begins[0]
    assert {"file", "chunk", "bytes", "queue_us", "device_us"} <= set(first["args"])
    assert re.fullmatch(r"[0-9a-f]{32}", first["args"]["file"])
    end = next(e for e in ends if e["id"] == first["id"])
    assert end["ts"] - first["ts"] == pytest.approx(first["args"]["total_us"], abs=0.01)


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("chromium is not installed (scripts/bootstrap installs Debian's chromium)")
    return found


def _headless(url: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        _chromium(), "--headless", "--no-sandbox", "--disable-gpu",
        "--disable-background-networking", "--disable-dev-shm-usage", "--no-first-run",
        f"--user-data-dir={profile}", *args, url,
    ]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_html_report_in_headless_chromium(
    real_run: Path, baseline_run: Path, tmp_path: Path
) -> None:
    html_path = real_run / "analysis" / "report-with-baseline.html"
    analyze_cli(str(real_run), "--html", str(html_path), "--baseline", str(baseline_run))
    text = html_path.read_text()
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    shot = real_run / "analysis" / "report.png"
    done = _headless(
        html_path.as_uri(), tmp_path / "profile", f"--screenshot={shot}",
        "--window-size=1200,4000", "--hide-scrollbars",
    )  # fmt: skip
    assert shot.is_file(), done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    dom = _headless(html_path.as_uri(), tmp_path / "profile", "--dump-dom").stdout
    for key, _title in SECTIONS:
        if key not in ("rpc", "iostat"):
            assert f'id="{key}"' in dom, key
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,', dom)
    assert len(images) >= 6, images
    assert dom.count("<table") >= 10
    assert "storage.handle_cache" in dom and 'id="rpc"' in dom


def test_full_synthetic_report_has_every_section(tmp_path: Path) -> None:
    clients = [*healthy_clients(), ClientSpec(7, "cn-7", {1: (400, 40, 2, ms(20, 400))})]
    run = make_run(tmp_path, cluster(), clients=clients, iostat=healthy_iostat(), trace=True)
    a = A.analyze(run, TH)
    html_path = tmp_path / "full.html"
    html_path.write_text(render_html(a, a))
    dom = _headless(html_path.as_uri(), tmp_path / "profile", "--dump-dom").stdout
    for key, _title in SECTIONS:
        assert f'id="{key}"' in dom, key
    alts = re.findall(r'<img alt="([^"]+)"', dom)
    assert {"RPC by target", "iostat", "per-node time series", "placement"} <= set(alts)
    assert "BFS-006" in dom and "Retry storm" in dom


def _execute(
    path: Path, results_dir: Path, workdir: Path, baseline: Path | None = None
) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    params = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1, f"{path.name} needs one cell tagged 'parameters'"
    params[0].source = re.sub(
        r"^RESULTS_DIR = .*$", f"RESULTS_DIR = {str(results_dir)!r}", params[0].source, flags=re.M
    )
    if baseline is not None:
        params[0].source = re.sub(
            r"^BASELINE_DIR = .*$",
            f"BASELINE_DIR = {str(baseline)!r}",
            params[0].source,
            flags=re.M,
        )
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    ).execute()
    return nb


def test_notebooks_run_against_the_real_run(
    real_run: Path, baseline_run: Path, tmp_path: Path
) -> None:
    assert {p.name for p in NOTEBOOKS} >= {
        "overview.ipynb", "io_depth.ipynb", "per_node_latency.ipynb", "placement.ipynb",
        "kernel.ipynb",
    }  # fmt: skip
    for path in NOTEBOOKS:
        nb = _execute(path, real_run, tmp_path, baseline_run)
        code = [c for c in nb.cells if c.cell_type == "code"]
        for cell in code:
            assert (
                "analysis." in cell.source
                or "plots." in cell.source
                or "a." in cell.source
                or "RESULTS_DIR" in cell.source
            ), f"{path.name}: logic in a cell: {cell.source}"
            assert not any(o.get("output_type") == "error" for o in cell.outputs), path.name
        outputs = json.dumps([c.outputs for c in code])
        assert "local-0" in outputs or real_run.name in outputs, path.name
        for cell in code:
            if "plots." in cell.source and "figure(" in cell.source:
                # Every figure cell draws a figure, and not a blank one.
                pngs = [
                    o["data"]["image/png"] for o in cell.outputs if "image/png" in o.get("data", {})
                ]
                assert pngs, f"{path.name}: {cell.source} shows no figure"
                image = Image.open(io.BytesIO(base64.b64decode(pngs[0]))).convert("L")
                colors = image.getcolors(maxcolors=1 << 16) or []
                assert len(colors) > 8, f"{path.name}: {cell.source} is blank"
            if "FlameGraphs(" in cell.source:
                html = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
                assert html.count("data:image/svg+xml;base64,") == 4, f"{path.name}: flame graphs"
            if "insights_table(" in cell.source:
                html = "".join(o.get("data", {}).get("text/html", "") for o in cell.outputs)
                assert "<table" in html and "BFS-" in html, f"{path.name}: no insights table"


def test_bench_analysis_quick_json(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "benchfs.cli.bench", "analysis", "--quick", "--json",
         "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=_clean_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert {"records", "load_s", "tables_s", "overhead_snapshots_pct", "overhead_trace_pct"} <= set(
        report
    )
    assert report["records"] == 200_000 and report["slow_node_found"] is True
    assert "target telemetry overhead" in rendered(analysis_bench.render, report)
    assert report["load_s"] > 0 and report["tables_s"] > 0
    assert isinstance(report["overhead_snapshots_pct"], float)
    assert isinstance(report["overhead_trace_pct"], float)
    per_op = report["overhead"]["cpu_ns_per_op"]
    assert per_op["off"] > 0 and per_op["snapshots"] > 0 and per_op["trace"] > 0
    # The trace case really traced: every read of its run became a record.
    trace_run = report["overhead"]["raw"]["trace"]
    assert trace_run["trace_records"] + trace_run["trace_dropped"] == trace_run["ops"] > 0
    assert report["overhead"]["raw"]["off"]["trace_records"] == 0
    assert list(tmp_path.iterdir()) == []  # scratch removed
    assert time.monotonic() - started < 120


def _laid_out(html_path: Path, profile: Path, width: int, height: int) -> dict[str, str]:
    """The report opened at width x height in headless Chromium: cells whose content is cut,
    and tables or images that leave the window without a scrolling box
    (tests/data/clipped_cells.html)."""
    probe = html_path.with_name(html_path.stem + "-probe.html")
    check = (REPO / "tests" / "data" / "clipped_cells.html").read_text()
    probe.write_text(html_path.read_text().replace("</body>", check + "</body>"))
    dom = _headless(probe.as_uri(), profile, f"--window-size={width},{height}", "--dump-dom")
    return dict(re.findall(r'data-(clipped|clipped-text|offscreen)="([^"]*)"', dom.stdout))


@pytest.mark.timeout(300)
def test_a_5_s_run_reads_on_a_laptop_screen(baseline_run: Path, tmp_path: Path) -> None:
    """A run of about 5 s, with the telemetry interval the pipeline picks: at least 10 points
    per node in each time series (op time and bandwidth), and its report (with a baseline) at
    1366x768 has no cut cell and nothing running off the window."""
    argv = [*benchfs_run_command(), "launch", "--file-size", "1G", "--results-root",
            str(tmp_path / "res"), "--json"]  # fmt: skip
    env = {**_clean_env(), "BENCHFS_RUN_KERNEL_TRACE": "false"}  # not what it checks
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    run = Path(json.loads(done.stdout)["results_dir"])
    a = A.analyze(run)
    summary = a.summary()
    assert summary["duration_s"] >= 2.0, summary  # a few seconds even on a fast machine
    for name, table in (("timeseries", a.tables.timeseries), ("bandwidth", a.tables.bandwidth)):
        busy = table if name == "timeseries" else table[table["node"] != "all"]
        points = busy.groupby("node").size()
        assert len(points) == 2 and (points >= 10).all(), (name, points.to_dict())
    html_path = tmp_path / "report.html"
    analyze_cli(str(run), "--html", str(html_path), "--baseline", str(baseline_run))
    seen = _laid_out(html_path, tmp_path / "profile", 1366, 768)
    assert seen.get("clipped") == "0", seen
    assert seen.get("offscreen") == "0", seen
