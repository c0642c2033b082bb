"""The HTML postmortem report: its structure checked with `html.parser` everywhere, and the page
as a real browser builds it checked in headless Chromium when one is installed (skipped, saying
so, when none is)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from gpufix.report.html import render_postmortem
from gpufix.report.html_plot import BUCKETS, GpuSeries, buckets
from gpufix.report.html_text import attr, clean, esc, ranks_text, to_epoch

from tests.report import postmortem_sample as sample

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


class Node:
    def __init__(self, tag: str, attrs: dict[str, str | None], parent: Node | None) -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.children: list[Node | str] = []

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def iter(self) -> Any:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def find_all(self, tag: str, cls: str | None = None) -> list[Node]:
        return [n for n in self.iter() if n.tag == tag and (cls is None or cls in n.classes)]

    def find(self, tag: str, cls: str | None = None) -> Node:
        found = self.find_all(tag, cls)
        assert found, f"no <{tag} class={cls}>"
        return found[0]

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)


class Dom(HTMLParser):
    """A small tree of the page; `errors` lists end tags that do not close what is open."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {}, None)
        self.current = self.root
        self.errors: list[str] = []
        self.feed(page)
        self.close()
        if self.current is not self.root:
            self.errors.append(f"unclosed <{self.current.tag}>")

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, dict(attrs), self.current)
        self.current.children.append(node)
        if tag not in VOID:
            self.current = node

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.current.children.append(Node(tag, dict(attrs), self.current))

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if self.current.tag != tag:
            self.errors.append(f"</{tag}> closes <{self.current.tag}>")
            node = self.current
            while node is not None and node.tag != tag:
                node = node.parent
            if node is None:
                return
            self.current = node
        assert self.current.parent is not None
        self.current = self.current.parent

    def handle_data(self, data: str) -> None:
        self.current.children.append(data)


@pytest.fixture(scope="module")
def page() -> str:
    doc, telemetry = sample.sample()
    return render_postmortem(doc, telemetry)


@pytest.fixture(scope="module")
def dom(page: str) -> Node:
    parsed = Dom(page)
    assert parsed.errors == []
    return parsed.root


def section_of(dom: Node, run_id: str) -> Node:
    return next(s for s in dom.find_all("section", "run") if run_id in s.find("h2").text())


# --- structure, with html.parser --------------------------------------------------------------

def test_one_document_with_title_language_and_headings(dom: Node) -> None:
    assert len(dom.find_all("html")) == 1 and dom.find("html").attrs.get("lang") == "en"
    assert dom.find("title").text() == "gpufix postmortem: 2 of 5 runs failed"
    assert dom.find("h1").text() == "gpufix postmortem: 2 of 5 runs failed"
    assert [h.text().split(":")[0] for h in dom.find_all("h2")][:2] == ["Summary", "Run 1"]
    assert all(th.attrs.get("scope") in ("col", "row") for th in dom.find_all("th"))


def test_nothing_loads_and_nothing_runs(page: str, dom: Node) -> None:
    csp = [m for m in dom.find_all("meta") if m.attrs.get("http-equiv") == "Content-Security-Policy"]
    assert csp and "default-src 'none'" in (csp[0].attrs["content"] or "") and "script-src 'none'" in (csp[0].attrs["content"] or "")
    for tag in ("script", "link", "img", "iframe", "object", "embed", "image", "use", "foreignobject", "base", "form"):
        assert dom.find_all(tag) == [], tag
    ids = {n.attrs["id"] for n in dom.iter() if n.attrs.get("id")}
    for node in dom.iter():
        assert not [a for a in node.attrs if a.startswith("on") or a in ("src", "srcset", "xlink:href", "data")], node.tag
        href = node.attrs.get("href")
        if href is not None and node.tag == "a" and not href.startswith("#"):
            assert href.startswith("https://") and node.parent and node.parent.parent
            assert node.parent.parent.parent and "References" in node.parent.parent.parent.text()
        elif href is not None:
            assert href[1:] in ids, href
    style = dom.find("style").text()
    assert "url(" not in style and "@import" not in style
    assert "javascript:" not in " ".join(str(n.attrs) for n in dom.iter())


def test_ids_are_unique(dom: Node) -> None:
    ids = [n.attrs["id"] for n in dom.iter() if n.attrs.get("id")]
    assert len(ids) == len(set(ids))


def test_summary_counts_table_groups_new_and_environment(dom: Node) -> None:
    summary = dom.find("section")
    assert summary.attrs["id"] == "summary"
    counts = [li.text() for li in summary.find("ul", "counts").find_all("li")]
    assert counts == ["5 runs", "2 failed", "2 succeeded", "1 running"]
    rows = summary.find("table", "runs").find("tbody").find_all("tr")
    assert [r.find("th").text() for r in rows] == [sample.GOOD_1, sample.GOOD_2, sample.BAD, sample.HOSTILE_ID, sample.RUNNING]
    assert [r.find("span", "badge").text() for r in rows] == ["succeeded", "succeeded", "failed", "failed", "running"]
    assert "MEM001 CUDA out of memory" in rows[2].text() and rows[2].find_all("td")[-1].text() == "3"
    by_code = summary.find("table", "by-code").text()
    assert "MEM001 CUDA out of memory" in by_code and "HW002" in by_code
    text = summary.text()
    assert "New since the last good run" in text and f"Relative to the last good run, {sample.GOOD_2}" in text
    diff = [[c.text() for c in r.children if isinstance(c, Node)] for r in summary.find("table", "diff").find("tbody").find_all("tr")]
    assert diff[0] == ["driver", "550.90.07", "560.35.03"]
    assert diff[2][2].startswith('<script>document.title="pwned"</script>')  # shown as text


def test_failed_run_root_cause_ranks_evidence_fixes_and_consequences(dom: Node) -> None:
    run = section_of(dom, sample.BAD)
    facts = dict(zip([d.text() for d in run.find("dl", "facts").find_all("dt")], [d.text() for d in run.find("dl", "facts").find_all("dd")]))
    assert facts["First failing rank"].startswith("3")
    assert facts["Affected ranks"].startswith("0–2, 4–7")
    assert facts["Failed at"].startswith("2026-11-27 04:00:00")
    assert facts["torchrun reported"].startswith("rank 0")
    root = run.find("div", "root")
    assert root.find("h3").text() == f"Root cause: {sample.OOM_TITLE}"
    assert "MEM001" in root.find("p", "tags").text() and "category oom" in root.find("p", "tags").text()
    rows = root.find("table", "evidence").find("tbody").find_all("tr")
    assert rows[0].find("td", "where").text() == f"nights/{sample.BAD}/output.log:48213"
    assert rows[1].find("td", "text").text().startswith('<script>document.title="pwned"</script></svg></table>"\'')
    assert "\\x1b[31m\\x00\\x07 \\u202eevil\\u202c" in rows[1].find("td", "text").text()
    huge = rows[2].find("td", "text").text()
    assert len(huge) < 1100 and huge.endswith("(199,010 more characters)")
    assert "… and 54 more lines." in root.text()
    fixes = [li.find("strong").text() for li in root.find("ol", "fixes").find_all("li")]
    assert fixes == ["Halve the per-GPU batch size", "Let the allocator expand segments", "Checkpoint activations"]
    assert "# </script><script>alert(2)</script>" in root.find_all("pre")[1].text()
    links = [a.attrs["href"] for a in root.find_all("a")]
    assert links == ["https://pytorch.org/docs/stable/notes/cuda.html#memory-management"]  # javascript: is text only
    consequences = run.find("ul", "compact").text()
    assert sample.NCCL_TITLE in consequences and "consequence of MEM001 on ranks 0–2, 4–7" in consequences


def test_hostile_run_id_and_no_telemetry(dom: Node) -> None:
    run = section_of(dom, sample.HOSTILE_ID)
    assert run.attrs["id"].startswith("run-4-") and re.fullmatch(r"[A-Za-z0-9_-]+", run.attrs["id"])
    assert "No telemetry recorded" in run.text() and run.find_all("svg") == []
    assert "node gpu-node-11, GPU 0000:41:00" in run.find("dl", "facts").text()
    row = dom.find("table", "runs").find("tbody").find_all("tr")[3]
    assert row.find_all("td")[-1].text() == "node gpu-node-11, GPU 0000:41:00"


def test_plots_per_gpu_with_the_failure_marked(dom: Node) -> None:
    run = section_of(dom, sample.BAD)
    figures = run.find_all("figure", "gpu")
    assert [f.find("figcaption").text().split(" (")[0] for f in figures] == [f"GPU {i}" for i in range(8)]
    for figure in figures:
        svgs = figure.find_all("svg")
        assert len(svgs) == 4
        for svg in svgs:
            assert svg.attrs.get("role") == "img" and svg.attrs.get("aria-label") and svg.find("title").text()
            marker = svg.find("g", "fail")
            assert marker.find("text").text() == "failed 04:00:00"
            for path in svg.find_all("path"):
                assert len(re.findall(r"[ML]", path.attrs["d"] or "")) <= 2 * BUCKETS + 2
    gpu3 = figures[3]
    assert gpu3.find("g", "xid").find("text").text() == "Xid 31"
    assert "peak 79.6 of 79.6 GiB" in gpu3.find_all("svg")[0].attrs["aria-label"]


def test_gaps_single_samples_and_healthy_runs(dom: Node) -> None:
    healthy = section_of(dom, sample.GOOD_2)
    assert healthy.find("details", "telemetry")  # a good run's plots fold away
    gpu1_power = healthy.find_all("figure", "gpu")[1].find_all("svg")[2]
    assert "not reported" in gpu1_power.text()
    gpu2_temp = healthy.find_all("figure", "gpu")[2].find_all("svg")[3]
    assert len(gpu2_temp.find_all("path")) == 3  # broken at the missing values and at the sampling pause
    running = section_of(dom, sample.RUNNING)
    panels = running.find("figure", "gpu").find_all("svg")
    assert panels[0].find_all("circle") and "not reported" in panels[1].text()
    assert "No root cause" in running.text() and running.find_all("g", "fail") == []


def test_empty_and_minimal_documents_render() -> None:
    empty = Dom(render_postmortem({"runs": [], "summary": {}}, {}))
    assert empty.errors == [] and "No run was found." in empty.root.text()
    bare = Dom(render_postmortem({"runs": [{"id": "x.log", "status": "failed", "root_cause": None, "findings": []}]}, {}))
    assert bare.errors == []
    text = bare.root.text()
    assert "No known failure pattern was found" in text and "No telemetry recorded" in text
    assert "No failed run has a known root cause." in text


def test_equal_run_ids_get_their_own_sections_and_the_document_is_not_changed() -> None:
    doc = {"runs": [{"id": "same", "status": "failed", "root_cause": {"code": "MEM001", "title": "OOM"}},
                    {"id": "same", "status": "succeeded"}], "summary": {"by_code": {}}}
    out = Dom(render_postmortem(doc, {}))
    assert out.errors == [] and [s.attrs["id"] for s in out.root.find_all("section", "run")] == ["run-1-same", "run-2-same"]
    assert doc["summary"] == {"by_code": {}}
    assert "MEM001 OOM" in out.root.find("table", "by-code").text()


def test_telemetry_ranges_from_the_document_when_no_samples_came() -> None:
    window = {"window_s": 300, "from": "2026-11-27T02:36:12", "to": "2026-11-27T02:41:12",
              "gpus": {"0": {"memory_used_mib": {"min": 70211, "max": 81050}, "temperature_c": {"min": 61, "max": 74}}}}
    out = Dom(render_postmortem({"runs": [{"id": "r", "status": "failed", "telemetry": window}]}, {"r": []})).root
    row = [c.text() for c in out.find("table", "window").find("tbody").find("tr").children if isinstance(c, Node)]
    assert row == ["GPU 0", "70211 – 81050", "—", "—", "61 – 74"]


def test_relative_sample_times_count_from_the_start() -> None:
    doc = {"runs": [{"id": "r", "status": "failed", "started": "2026-11-27T02:00:00", "failed_at": "2026-11-27T02:01:00"}]}
    records = [{"t": float(i), "gpu": 0, "temperature_c": 50 + i % 7} for i in range(120)]
    out = Dom(render_postmortem(doc, {"r": records})).root
    assert out.find("g", "fail").find("text").text() == "failed 02:01:00"
    assert [t.text() for t in out.find_all("svg")[3].find_all("text", "tick")][-4:] == ["02:00:00", "02:00:30", "02:01:00", "02:01:30"]


def test_failure_outside_the_recording_is_said_not_drawn() -> None:
    doc = {"runs": [{"id": "r", "status": "failed", "failed_at": "2026-11-27T09:00:00", "findings": []}]}
    start = to_epoch("2026-11-27T02:00:00")
    assert start is not None
    records = [{"t": start + i, "gpu": 0, "memory_used_mib": 100} for i in range(60)]
    out = Dom(render_postmortem(doc, {"r": records})).root
    assert out.find_all("g", "fail") == [] and "after the recording ended" in out.find("p", "note").text()


def test_text_is_escaped_cleaned_and_cut() -> None:
    assert esc('<a href="x">&') == "&lt;a href=&quot;x&quot;&gt;&amp;"
    assert clean("a\x1bb\x00\u202ec\ud800") == "a\\x1bb\\x00\\u202ec\ufffd"
    assert clean("x" * 1000, 10) == "x" * 10 + " … (990 more characters)"
    assert attr("a\nb\tc") == "a b c"
    assert ranks_text([7, 0, 1, 2, 4, 5]) == "0–2, 4, 5, 7" and ranks_text([]) == "—"
    assert to_epoch("2026-11-27T02:00:00") == to_epoch("2026-11-27T02:00:00Z") == to_epoch(1795744800)


def test_downsampling_keeps_spikes_and_bounds_points() -> None:
    run = [(float(t), 1.0) for t in range(100_000)]
    run[54_321] = (54_321.0, 99.0)
    reduced = buckets(run, 0.0, 100_000 / BUCKETS)
    assert len(reduced) <= BUCKETS + 1
    assert max(high for _, _, high in reduced) == 99.0 and min(low for _, low, _ in reduced) == 1.0
    series = GpuSeries([{"t": 0, "x": 1}, {"t": 1, "x": None}, {"t": 2, "x": 3}, {"t": 30, "x": 4}, {"t": 31, "x": float("nan")}])
    assert series.runs("x") == [[(0.0, 1.0)], [(2.0, 3.0)], [(30.0, 4.0)]]


# --- the page as a browser builds it -----------------------------------------------------------

def _chromium() -> str | None:
    if Path("/usr/bin/chromium").exists():
        return "/usr/bin/chromium"
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


CHROMIUM = _chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="no headless browser: /usr/bin/chromium (or chromium, chromium-browser, google-chrome on PATH) "
                             "not found; install it with `apt-get install -y chromium`")


def dump_dom(path: Path, profile: Path) -> str:
    """The DOM after loading and running the page, serialised by Chromium."""
    assert CHROMIUM is not None
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=3000", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=90,
    )
    assert done.returncode == 0 and "<html" in done.stdout, done.stderr[-2000:]
    return done.stdout


PROBE = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var out = document.createElement("pre"); out.id = "probe";
  out.textContent = JSON.stringify({title: document.title, pwned: document.body.dataset.pwned || null,
    resources: performance.getEntriesByType("resource").map(function (e) { return e.name; })});
  document.body.appendChild(out); }, 500); });
</script>"""


@needs_chromium
def test_in_headless_chromium(page: str, tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    report.write_text(page, encoding="utf-8")
    parsed = Dom(dump_dom(report, tmp_path / "profile-1"))
    shown = parsed.root
    assert shown.find("title").text() == "gpufix postmortem: 2 of 5 runs failed"
    rows = shown.find("table", "runs").find("tbody").find_all("tr")
    assert [r.find("th").text() for r in rows] == [sample.GOOD_1, sample.GOOD_2, sample.BAD, sample.HOSTILE_ID, sample.RUNNING]
    assert [h.text() for h in shown.find_all("div", "root") for h in h.find_all("h3")[:1]] == [
        f"Root cause: {sample.OOM_TITLE}", f"Root cause: {sample.XID_TITLE}"]
    run = section_of(shown, sample.BAD)
    texts = [td.text() for td in run.find_all("td", "text")]
    assert texts[0].startswith("[rank3]: torch.OutOfMemoryError: CUDA out of memory.")
    assert texts[1].startswith('<script>document.title="pwned"</script></svg></table>')
    figures = run.find_all("figure", "gpu")
    assert len(figures) == 8 and all(len(f.find_all("g", "fail")) == 4 for f in figures)
    assert all(len(f.find_all("svg")) == 4 for f in figures)
    assert shown.find_all("script") == [] and shown.find_all("img") == []
    assert not [n for n in shown.iter() if n.attrs.get("src") is not None and not (n.attrs["src"] or "").startswith("data:")]
    assert "No telemetry recorded" in section_of(shown, sample.HOSTILE_ID).text()
    assert "pwned" not in (shown.find("body").attrs.get("data-pwned") or "")

    # The same page without its Content-Security-Policy, plus a probe: escaping alone must keep the
    # hostile text inert, and the page must fetch nothing even where the policy is not there to stop it.
    unguarded = re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', "", page, count=1)
    assert unguarded != page
    probe_page = tmp_path / "probe.html"
    probe_page.write_text(unguarded.replace("</body>", PROBE + "</body>"), encoding="utf-8")
    probed = Dom(dump_dom(probe_page, tmp_path / "profile-2")).root
    result = json.loads(next(n for n in probed.iter() if n.attrs.get("id") == "probe").text())
    assert result == {"title": "gpufix postmortem: 2 of 5 runs failed", "pwned": None, "resources": []}
