"""A failing check is told in two steps: what and where first, the cause and the fix on a second look.

A student who is handed the fix at once learns nothing by looking. The notebook's check prints the
headline and ``where:``; the same failure checked again (same file, part and cause) adds the likely
cause and the hint; ``checks.explain()`` prints them at once. A failure with no cause (a part not
started, a crash) has nothing to hold back: its hint shows at once.
"""

from gqa_flash.course.lab.checks import common as v


def _failure(cause="query head h reads KV head h % Hkv", where="head 2, row 3: got 1, expected 2"):
    return v.fail("naive", 1, "does not match the float64 reference", where=where, cause=cause, hint="use //")


def test_the_first_look_says_what_and_where_and_holds_the_cause_back(monkeypatch):
    monkeypatch.setattr(v, "_SEEN", {})
    first = v.staged(_failure())
    assert "where: head 2, row 3" in first and "% Hkv" not in first and "use //" not in first
    assert v.STEP_TWO in first


def test_the_same_failure_again_reveals_the_cause_even_at_other_values(monkeypatch):
    monkeypatch.setattr(v, "_SEEN", {})
    v.staged(_failure())
    second = v.staged(_failure(where="head 3, row 0: got 5, expected 4"))  # fresh inputs, same mistake
    assert "likely cause: query head h reads KV head h % Hkv" in second and "hint: use //" in second


def test_another_failure_starts_again_at_step_one(monkeypatch):
    monkeypatch.setattr(v, "_SEEN", {})
    v.staged(_failure())
    other = v.staged(_failure(cause="the mask keeps the diagonal out"))
    assert "diagonal" not in other and v.STEP_TWO in other


def test_explain_prints_the_last_failure_in_full(monkeypatch, capsys):
    monkeypatch.setattr(v, "_SEEN", {})
    monkeypatch.setattr(v, "_LAST", [])
    v.explain()
    assert "no check has failed" in capsys.readouterr().out
    v.staged(_failure())
    v.explain()
    assert "likely cause: query head h reads KV head h % Hkv" in capsys.readouterr().out


def test_a_failure_without_a_cause_and_a_pass_show_everything_at_once(monkeypatch):
    monkeypatch.setattr(v, "_SEEN", {})
    todo = v.fail("naive", 1, "Part 1 is not implemented yet", hint="open gqa_flash/naive.py, fill in Part 1")
    assert "hint: open gqa_flash/naive.py" in v.staged(todo)
    assert v.staged(v.Verdict(True, "naive.py", "matches")) == "PASS naive.py: matches"
