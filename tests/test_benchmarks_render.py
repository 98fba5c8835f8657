"""BENCHMARKS.md is the rendering of benchmarks/sections with the JSON in benchmarks/out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark_scripts import load_script

ROOT = Path(__file__).resolve().parents[1]


render = load_script("render")


def _bench(tmp_path: Path, section: str, results: dict[str, object]) -> Path:
    (tmp_path / "sections").mkdir(parents=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "sections" / "01_a.md").write_text(section, encoding="utf-8")
    for name, data in results.items():
        (tmp_path / "out" / name).write_text(json.dumps(data), encoding="utf-8")
    return tmp_path


def test_committed_benchmarks_md_is_the_rendering() -> None:
    assert render.main(["--check"]) == 0


def test_every_section_template_is_rendered_in_order() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[0].startswith("## Answer quality end to end")
    assert "{{" not in text and "<!-- table" not in text and "<!-- include" not in text


def test_tables_and_values_come_from_the_json(tmp_path: Path) -> None:
    section = (
        "## Cost\n\nBest: {{ out/cost.json : rows.1.s | .1f }} s.\n\n"
        "<!-- table\nrows: out/cost.json[rows]\nalign: l r l\n"
        "name = name\nseconds = s | .2f\nok = s | atmost:1:met:NOT met\n-->\n"
    )
    root = _bench(
        tmp_path,
        section,
        {"cost.json": {"rows": [{"name": "a", "s": 1.234}, {"name": "b", "s": 0.5}]}},
    )
    text = render.Renderer(root).render(root / "sections")
    assert "Best: 0.5 s." in text
    assert "| name | seconds | ok |\n| --- | ---: | --- |" in text
    assert "| a | 1.23 | NOT met |\n| b | 0.50 | met |" in text


def test_rows_can_be_single_objects_labelled_by_their_path(tmp_path: Path) -> None:
    section = (
        "<!-- table\nrows: out/ab.json:before out/ab.json:after\n"
        "run = @key | map:before=old code:after=new code\nF1 = f1 | .2f\n-->\n"
    )
    root = _bench(tmp_path, section, {"ab.json": {"before": {"f1": 0.5}, "after": {"f1": 0.75}}})
    text = render.Renderer(root).render(root / "sections")
    assert "| old code | 0.50 |\n| new code | 0.75 |" in text


def test_a_key_with_dots_in_it_is_found(tmp_path: Path) -> None:
    results = {"p.json": {"rows": {"recall, k=5.0": {"R": 0.5}, "recall": {"k": 1}}}}
    section = "{{ out/p.json : rows.recall, k=5.0.R | .2f }} {{ out/p.json : rows.recall.k }}\n"
    root = _bench(tmp_path, section, results)
    assert render.Renderer(root).render(root / "sections").strip().endswith("\n0.50 1")
    missing = _bench(tmp_path / "b", "{{ out/p.json : rows.recall, k=5.0.S }}\n", results)
    with pytest.raises(render.RenderError, match="no key 'S'"):
        render.Renderer(missing).render(missing / "sections")


def test_a_figure_that_cannot_be_found_stops_the_rendering(tmp_path: Path) -> None:
    root = _bench(tmp_path, "x {{ out/cost.json : missing }}\n", {"cost.json": {"s": 1}})
    with pytest.raises(render.RenderError, match=r"01_a\.md:1: no key 'missing'"):
        render.Renderer(root).render(root / "sections")


def test_directives_cannot_read_outside_the_benchmarks_folder(tmp_path: Path) -> None:
    root = _bench(tmp_path / "b", "<!-- include: ../secret.md -->\n", {})
    (tmp_path / "secret.md").write_text("secret", encoding="utf-8")
    with pytest.raises(render.RenderError, match="outside"):
        render.Renderer(root).render(root / "sections")


def test_check_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "BENCHMARKS.md"
    stale.write_text("# old\n", encoding="utf-8")
    assert render.main(["--check", "--out", str(stale)]) == 1
    assert render.main(["--out", str(stale)]) == 0
    assert render.main(["--check", "--out", str(stale)]) == 0
