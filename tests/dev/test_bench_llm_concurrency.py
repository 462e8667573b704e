"""``hecate bench llm --concurrency``: the levels reach the suite as typed, a bad list is
refused at the command line, a wrong text among many users fails the command, and the
report draws the many-users picture it links."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from hecate.cli.main import main
from hecate_dev.bench.concurrency import Generation, level_figures, over_rounds
from tests.dev.bench_results import results


def _users(wrong: int = 0) -> dict[str, Any]:
    gens = [Generation(0.0, 2.0, 0.5, 16, text_ok=i < 2 - wrong) for i in range(2)]
    rounds = [{"order": [1, 2], "levels": {"1": level_figures(gens[:1]), "2": level_figures(gens)}}]
    return {
        "levels": over_rounds(rounds),
        "rounds": rounds,
        "meta": {
            "levels": [1, 2],
            "tokens": 16,
            "rounds": 1,
            "prompts": 16,
            "reference": "in this process with the numpy model, before the swarm starts",
            "deadline_s": {"1": 68.0, "2": 76.0},
            "swarm": "hecate up --topology examples/smollm2.json",
        },
    }


def test_the_levels_rounds_and_tokens_reach_the_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hecate_dev.bench.llm

    seen: dict[str, Any] = {}

    def fake(**kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return {"concurrency": _users(), "failed_checks": []}

    monkeypatch.setattr(hecate_dev.bench.llm, "run_llm_bench", fake)
    argv = ["bench", "llm", "--only-concurrency", "--concurrency", "1,2", "--rounds", "2"]
    assert main([*argv, "--tokens", "4", "--results", str(tmp_path)]) == 0
    assert seen == {"tokens": 4, "rounds": 2, "concurrency": (1, 2), "only_concurrency": True}
    main(["bench", "llm", "--quick"])
    assert seen["concurrency"] == (1, 2)
    main(["bench", "llm"])
    assert (seen["concurrency"], seen["rounds"], seen["tokens"]) == ((1, 2, 4, 8, 16, 32), 8, 48)


def test_a_bad_list_of_levels_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("1,1", "0", "one"):
        with pytest.raises(SystemExit) as exit_:
            main(["bench", "llm", "--concurrency", bad])
        assert exit_.value.code == 2
        assert "distinct whole numbers" in capsys.readouterr().err


def test_a_wrong_text_among_many_users_fails_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hecate_dev.bench.llm
    from hecate_dev.bench.concurrency import failed_checks

    users = _users(wrong=1)
    figures = {"concurrency": users, "failed_checks": failed_checks(users["rounds"])}
    monkeypatch.setattr(hecate_dev.bench.llm, "run_llm_bench", lambda **_kw: figures)
    assert main(["bench", "llm", "--only-concurrency", "--results", str(tmp_path)]) == 1
    saved = json.loads((tmp_path / "llm.json").read_text())
    assert saved["report"]["failed_checks"] == ["concurrency 2 (round 1): 1 of 2 texts wrong"]


def test_the_report_draws_the_many_users_picture_it_links(tmp_path: Path) -> None:
    saved = tmp_path / "results"
    saved.mkdir()
    docs = results()
    docs["llm"]["report"] = {**copy.deepcopy(docs["llm"]["report"]), "concurrency": _users()}
    for suite, doc in docs.items():
        (saved / f"{suite}.json").write_text(json.dumps(doc))
    out = tmp_path / "docs" / "BENCHMARKS.md"
    img = tmp_path / "docs" / "img"
    argv = ["bench", "report", "--results", str(saved), "--doc", str(out), "--img", str(img)]
    assert main(argv) == 0
    linked = re.findall(r"\]\(img/([\w-]+\.png)\)", out.read_text())
    assert "bench-llm-concurrency.png" in linked
    assert (img / "bench-llm-concurrency.png").read_bytes()[:4] == b"\x89PNG"
