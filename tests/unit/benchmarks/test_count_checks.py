"""benchmarks/count_checks.py: the census that guards "no fewer tests, no fewer assertions"."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import count_checks  # noqa: E402

SAMPLE = '''
import pytest

def helper(x):
    assert x  # a helper's checks count for the helper

def test_one():
    assert 1 == 1
    assert 2.0 == pytest.approx(2.0)
    with pytest.raises(ValueError):
        int("x")
    def inner():
        assert True  # nested: belongs to test_one
    inner()

class TestThing:
    def test_method(self):
        with pytest.warns(UserWarning):
            pass
        assert [1] == [1]

def test_not_a_check():
    raises = approx = None  # names alone are not checks
    other.raises(ValueError)
'''


def _tree(tmp_path: Path, text: str = SAMPLE) -> Path:
    (tmp_path / "sub").mkdir(parents=True)
    (tmp_path / "sub" / "test_sample.py").write_text(text)
    (tmp_path / "empty.py").write_text("x = 1\n")
    return tmp_path


def test_counts_each_kind_per_file_and_per_function(tmp_path: Path) -> None:
    result = count_checks.census(_tree(tmp_path))
    assert dict(result.totals) == {"assert": 5, "approx": 1, "raises": 1, "warns": 1}
    assert list(result.files) == ["sub/test_sample.py"]  # files without checks are not listed
    assert result.functions["test_sample::test_one"] == {"assert": 3, "approx": 1, "raises": 1}
    assert result.functions["test_sample::helper"] == {"assert": 1}
    assert result.functions["test_sample::TestThing.test_method"] == {"warns": 1, "assert": 1}
    assert "test_sample::test_not_a_check" not in result.functions


def test_compare_fails_on_fewer_checks_and_lists_moved_ones(tmp_path: Path) -> None:
    before = tmp_path / "before.json"
    root = _tree(tmp_path / "a")
    assert count_checks.main([str(root), "--json", str(before)]) == 0
    assert json.loads(before.read_text())["totals"]["assert"] == 5

    moved = SAMPLE.replace("        assert [1] == [1]\n", "").replace("    assert 1 == 1\n", "    assert 1 == 1\n    assert 3\n")
    same_total = _tree(tmp_path / "b", moved)  # one assert moved from the method to test_one: totals equal
    assert count_checks.main([str(same_total), "--compare", str(before)]) == 0
    lines = count_checks.compare(count_checks.census(same_total), json.loads(before.read_text()))
    assert lines == ["  down in test_sample::TestThing.test_method: assert 1->0"]

    renamed = tmp_path / "r"
    _tree(renamed).joinpath("sub", "test_sample.py").rename(renamed / "sub" / "test_renamed.py")
    assert count_checks.compare(count_checks.census(renamed), json.loads(before.read_text())) == []

    fewer = _tree(tmp_path / "c", SAMPLE.replace("    assert 1 == 1\n", ""))
    assert count_checks.main([str(fewer), "--compare", str(before)]) == 1
    assert count_checks.compare(count_checks.census(fewer), json.loads(before.read_text()))[0] == "FEWER assert: 5 -> 4"
