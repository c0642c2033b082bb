"""The HTML report's style sheet: light and dark schemes, plots coloured by class, print layout."""

from __future__ import annotations

CSS = """
:root { color-scheme: light dark;
  --bg: #ffffff; --fg: #1b1f24; --muted: #5b6470; --line: #d5dae0; --panel: #f5f7f9; --code: #eef1f4;
  --link: #0a58ca; --bad: #b42318; --bad-bg: #fde8e6; --good: #1a7f37; --good-bg: #e3f5e8;
  --other: #7a5a00; --other-bg: #fbf1d2; --grid: #e4e8ec;
  --c-memory: #1f6fd1; --c-util: #178a4a; --c-power: #c25e00; --c-temp: #8e3bbf; --fail: #d1242f; --xid: #d98a00; }
@media (prefers-color-scheme: dark) { :root {
  --bg: #0f1318; --fg: #e3e7ec; --muted: #9aa4b0; --line: #323a44; --panel: #171d24; --code: #1e252e;
  --link: #79b0ff; --bad: #ff8a80; --bad-bg: #3b1715; --good: #6fd88e; --good-bg: #11301c;
  --other: #f2c94c; --other-bg: #3a300d; --grid: #262e37;
  --c-memory: #6aa8ff; --c-util: #5ad38b; --c-power: #ffa24d; --c-temp: #cf8bff; --fail: #ff6b6b; --xid: #ffc14d; } }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1320px; margin: 0 auto; padding: 1.5rem 1.5rem 4rem; }
h1 { font-size: 1.6rem; margin: 0 0 .25rem; }
h2 { font-size: 1.3rem; margin: 2.5rem 0 .75rem; padding-top: .75rem; border-top: 2px solid var(--line); }
h3 { font-size: 1.1rem; margin: 1.5rem 0 .5rem; }
h4 { font-size: .95rem; margin: 1rem 0 .35rem; }
a { color: var(--link); }
code, pre, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; font-size: .86em; }
code { background: var(--code); padding: .05em .3em; border-radius: 3px; overflow-wrap: anywhere; }
pre { background: var(--code); padding: .6rem .8rem; border-radius: 4px; white-space: pre-wrap;
  overflow-wrap: anywhere; margin: .35rem 0; }
pre code { background: none; padding: 0; font-size: 1em; }
.meta, .tags { color: var(--muted); font-size: .88rem; }
.none { color: var(--muted); font-style: italic; }
.note { border-left: 3px solid var(--other); padding-left: .6rem; }
table { border-collapse: collapse; width: 100%; margin: .5rem 0 1rem; font-size: .92rem; }
caption { text-align: left; color: var(--muted); font-size: .88rem; padding-bottom: .25rem; }
th, td { text-align: left; vertical-align: top; padding: .35rem .6rem; border-bottom: 1px solid var(--line); }
thead th { border-bottom: 2px solid var(--line); white-space: nowrap; }
tbody th { font-weight: 600; }
.counts { list-style: none; padding: 0; margin: .75rem 0; display: flex; flex-wrap: wrap; gap: .6rem; }
.counts li { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: .4rem .9rem; }
.counts strong { font-size: 1.3rem; margin-right: .3rem; }
.counts .bad strong { color: var(--bad); } .counts .good strong { color: var(--good); } .counts .other strong { color: var(--other); }
.badge { display: inline-block; font-size: .8rem; font-weight: 600; padding: .05rem .5rem; border-radius: 999px;
  vertical-align: middle; }
.badge.bad { color: var(--bad); background: var(--bad-bg); }
.badge.good { color: var(--good); background: var(--good-bg); }
.badge.other { color: var(--other); background: var(--other-bg); }
.facts { display: grid; grid-template-columns: max-content 1fr; gap: .2rem 1.2rem; margin: .5rem 0 1rem; }
.facts dt { color: var(--muted); }
.facts dd { margin: 0; }
.finding { background: var(--panel); border: 1px solid var(--line); border-left: 4px solid var(--muted);
  border-radius: 6px; padding: .6rem 1rem .8rem; margin: .5rem 0 1rem; }
.finding.root { border-left-color: var(--bad); }
.finding h3 { margin-top: .2rem; }
.message { font-weight: 600; }
.evidence td.text { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: .84rem;
  white-space: pre-wrap; overflow-wrap: anywhere; width: 70%; }
.evidence td.where { overflow-wrap: anywhere; font-size: .84rem; }
.fixes li { margin-bottom: .5rem; }
.kind { font-size: .78rem; color: var(--muted); border: 1px solid var(--line); border-radius: 3px; padding: 0 .3rem; }
.compact li { margin-bottom: .4rem; }
.diff td.changed { font-weight: 600; }
.gpu { margin: .75rem 0 1.25rem; break-inside: avoid; }
.gpu figcaption { font-weight: 600; margin-bottom: .25rem; }
.panels { display: grid; grid-template-columns: repeat(auto-fill, minmax(270px, 1fr)); gap: .5rem; }
svg.plot { width: 100%; height: auto; background: var(--panel); border: 1px solid var(--line); border-radius: 4px; }
svg.plot text { fill: var(--fg); font-size: 10px; font-family: system-ui, sans-serif; }
svg.plot .ptitle { font-weight: 600; font-size: 11px; }
svg.plot .pvalue, svg.plot .tick, svg.plot .empty { fill: var(--muted); }
svg.plot .grid { stroke: var(--grid); stroke-width: 1; }
svg.plot .frame { fill: none; stroke: var(--line); }
svg.plot .line { fill: none; stroke-width: 1.5; stroke-linejoin: round; }
svg.plot .ref { stroke-dasharray: 4 3; stroke-width: 1.2; opacity: .8; }
svg.plot .band { stroke-width: .8; stroke-linejoin: round; fill-opacity: .4; }
svg.plot .band.ref { fill-opacity: .15; }
svg.plot .memory { stroke: var(--c-memory); fill: var(--c-memory); } svg.plot .util { stroke: var(--c-util); fill: var(--c-util); }
svg.plot .power { stroke: var(--c-power); fill: var(--c-power); } svg.plot .temp { stroke: var(--c-temp); fill: var(--c-temp); }
svg.plot .line { fill: none; }
svg.plot .marker line { stroke-width: 1.5; stroke-dasharray: 5 3; }
svg.plot .marker text { paint-order: stroke; stroke: var(--panel); stroke-width: 3px; stroke-linejoin: round; }
svg.plot .marker.fail line { stroke: var(--fail); } svg.plot .marker.fail text { fill: var(--fail); font-weight: 600; }
svg.plot .marker.xid line { stroke: var(--xid); } svg.plot .marker.xid text { fill: var(--xid); }
details.telemetry > summary { cursor: pointer; color: var(--muted); margin: 1.5rem 0 .5rem; }
details.telemetry > summary h3 { display: inline; margin: 0; color: var(--fg); }
.run-head { display: flex; flex-wrap: wrap; align-items: baseline; gap: .4rem 1rem; margin-top: 2.5rem;
  padding-top: .75rem; border-top: 2px solid var(--line); }
.run-head h2 { margin: 0; padding: 0; border: 0; }
.top { font-size: .85rem; }
footer { color: var(--muted); font-size: .85rem; margin-top: 3rem; }
@media print {
  :root { --bg: #fff; --fg: #000; --muted: #444; --panel: #fff; --code: #f3f3f3; --line: #bbb; --grid: #e5e5e5; --link: #000;
    --bad: #b42318; --bad-bg: #fde8e6; --good: #1a7f37; --good-bg: #e3f5e8; --other: #7a5a00; --other-bg: #fbf1d2;
    --c-memory: #1f6fd1; --c-util: #178a4a; --c-power: #c25e00; --c-temp: #8e3bbf; --fail: #d1242f; --xid: #d98a00; }
  body { font-size: 11pt; }
  main { max-width: none; padding: 0; }
  .top { display: none; }
  section.run { break-before: page; }
  .finding, figure, tr, pre { break-inside: avoid; }
  .panels { grid-template-columns: repeat(2, 1fr); }
}
"""
