"""bench.dispatch_tail: the plan's dispatch cell with more samples a round and more rounds, its
settings said in the cell's text, and a plan of that cell alone (a --cells subset run)."""

import pytest

from bench import dispatch_tail, harness
from bench.plan import build


def _dispatch():
    [cell] = [c for c in build("full") if c.name == "dispatch"]
    return cell


def test_the_tail_cell_is_the_dispatch_cell_with_its_sample_settings_changed_and_said():
    base = _dispatch()
    cell = dispatch_tail.tail_cell(base, 600, 0.4, 3)
    assert (cell.name, cell.job, cell.metrics, cell.arms, cell.db) == (
        base.name,
        base.job,
        base.metrics,
        base.arms,
        base.db,
    )
    assert cell.params == {**base.params, "n": 600, "gap": 0.4}
    assert cell.reps == 3
    assert "random pause of 0..0.4 s" in cell.about and "0..1 s" not in cell.about
    assert "600 samples a round, 3 rounds an arm" in cell.about
    assert cell.timeout >= 600 * 1.4  # a round of 600 slow samples is not cut short
    assert base.params["n"] == 200 and base.reps == 1  # the plan's own cell is left as it was


def test_the_run_is_the_tail_cell_alone_as_a_cells_subset(monkeypatch):
    seen = {}

    def fake_main(argv):
        seen["argv"] = argv
        seen["plan"] = harness.build("full")

    monkeypatch.setattr(harness, "main", fake_main)
    monkeypatch.setattr(harness, "build", harness.build)  # restored after the test
    dispatch_tail.main(["--n", "300", "--gap", "0.2", "--reps", "2", "--out", "/tmp/x.json"])
    assert seen["argv"] == ["--cells", "dispatch", "--arms", "ox,pgqueuer", "--out", "/tmp/x.json"]
    [cell] = seen["plan"]
    assert (cell.name, cell.params["n"], cell.params["gap"], cell.reps) == ("dispatch", 300, 0.2, 2)


@pytest.mark.parametrize("bad", [["--n", "50"], ["--reps", "0"], ["--gap", "0"], ["--gap", "nan"]])
def test_settings_a_tail_cannot_be_read_from_are_refused(bad, monkeypatch):
    monkeypatch.setattr(harness, "main", lambda argv: pytest.fail("ran"))
    with pytest.raises(SystemExit):
        dispatch_tail.main(bad)
