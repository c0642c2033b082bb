"""`gpufix rules ...`: list, show, check and test rule packs."""

from __future__ import annotations

import os
import sys

import click

from gpufix.cli.options import rules_option
from gpufix.cli.output import EXIT_ERROR, EXIT_FINDINGS, fail
from gpufix.report.terminal import emit, use_color
from gpufix.errors import GpufixError, RuleError


@click.group("rules")
def rules_group() -> None:
    """List, show, check and test diagnosis rules."""


def _load(rule_dirs: tuple[str, ...]):  # noqa: ANN202 - RuleSet, imported lazily
    from gpufix.rules.loader import load_ruleset

    try:
        return load_ruleset(rule_dirs, full=True)
    except GpufixError as exc:
        fail(exc)


@rules_group.command("list")
@click.option("--category", help="Only rules of this category.")
@rules_option
def list_cmd(category: str | None, rule_dirs: tuple[str, ...]) -> None:
    """One line per rule: code, name, category, severity, status, title."""
    ruleset = _load(rule_dirs)
    rows = [r for r in ruleset.rules if category in (None, r.category)]
    for rule in sorted(rows, key=lambda r: r.code):
        click.echo(f"{rule.code:<8} {rule.name:<40} {rule.category:<22} {rule.severity:<8} {rule.status:<10} {rule.title}")
    click.echo(f"{len(rows)} rules", err=True)


@rules_group.command("show")
@click.argument("code")
@rules_option
def show_cmd(code: str, rule_dirs: tuple[str, ...]) -> None:
    """The documentation of one rule (by code or name)."""
    from gpufix.report.rule import render_rule

    ruleset = _load(rule_dirs)
    rule = ruleset.get(code) or next((r for r in ruleset.rules if r.name == code), None)
    if rule is None:
        fail(GpufixError(f"no rule {code!r}", hint="`gpufix rules list` shows every code"))
    color = use_color()
    emit(render_rule(rule, color), color)


@rules_group.command("check")
@click.argument("paths", nargs=-1, type=click.Path())
def check_cmd(paths: tuple[str, ...]) -> None:
    """Validate rule files (default: the built-in pack and GPUFIX_RULES_PATH).

    Every problem is printed as `path:line: message`; exit 2 when there is any.
    """
    from gpufix.rules import loader

    try:
        dirs = loader.rule_dirs(paths)
        files = loader.rule_files(dirs)
        entries, problems = loader.validate_files(files)
        problems += loader.cross_check(entries, loader.builtin_rules_dir())
    except RuleError as exc:
        fail(exc)
    if paths:  # report on what was asked; the rest of the pack only resolves references
        asked = {os.path.realpath(f) for f in loader.rule_files(list(paths))}
        files = [f for f in files if os.path.realpath(f) in asked]
        entries = [e for e in entries if os.path.realpath(e["source"]) in asked]
        problems = [p for p in problems if any(p.startswith(f + ":") for f in files)]
    for problem in problems:
        click.echo(problem)
    if problems:
        click.echo(f"{len(problems)} problem(s) in {len(files)} file(s)", err=True)
        sys.exit(EXIT_ERROR)
    click.echo(f"{len(entries)} rules in {len(files)} files: OK")


@rules_group.command("test")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("-v", "--verbose", is_flag=True, help="List every example, not only failures.")
def test_cmd(paths: tuple[str, ...], verbose: bool) -> None:
    """Run each rule's own examples (match, no_match, known_misses). Exit 1 on a failure."""
    from gpufix.rules import loader
    from gpufix.rules.harness import run_examples

    try:
        ruleset = loader.load_ruleset(paths, full=True)
    except GpufixError as exc:
        fail(exc)
    selected = None
    if paths:
        selected = [r for r in ruleset.rules if any(loader.is_within(r.source, p) for p in paths)]
    results = run_examples(ruleset, selected)
    failed = [r for r in results if not r.ok]
    for result in results if verbose else failed:
        click.echo(("ok    " if result.ok else "FAIL  ") + (result.problem if not result.ok else f"{result.code} {result.kind}[{result.index}]"))
    rules = len({r.code for r in results})
    click.echo(f"{len(results) - len(failed)} passed, {len(failed)} failed ({rules} rules)")
    if failed:
        sys.exit(EXIT_FINDINGS)
