"""Output paths never destroy data: `table --json/--md` refuses a path inside a zarr store and
replaces only an earlier table; `report`, `scan-report` and `demo` refuse a folder holding files
they would write (a user's report.md) unless --overwrite, which replaces only an earlier result;
`compare --recipes` gives clashing recipe names distinct folders; `generate --overwrite` replaces
only an earlier clip, never a user's config.json.

Real stores (a copy of the shipped capture, a real scan of it), real CLI runs in process.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from workbench.capture import open_capture

from test_store_safety import cli, digest  # noqa: E402  (one-line CLI runs, tree digests)

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "captures" / "demo_h3_nano.zarr"
FAST = ["--queries", "8"]


def refused(rc: int, err: str, command: str, *needles) -> str:
    """Exit 2 with one `workbench CMD: error: ...` line holding every needle."""
    assert rc == 2, err
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith(f"workbench {command}: error: ")]
    assert len(lines) == 1, err
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


@pytest.fixture
def store(tmp_path) -> Path:
    """A copy of the shipped capture store for each test (12 MB): a write the fix should have
    refused damages neither the real one nor the next test's."""
    return shutil.copytree(SHIPPED, tmp_path / "S.zarr")


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> Path:
    """A real scan store of one entry of a copy of the shipped capture."""
    from workbench.evaluate.scan import run_scan

    d = tmp_path_factory.mktemp("scan")
    out = d / "s.scan.zarr"
    run_scan(shutil.copytree(SHIPPED, d / "S.zarr"), "fp8_sol_unsmoothed,fp8_sol_kv_corrected",
             out=out, scheduler="synchronous", progress=False, steps=[7], layers=[1],
             n_queries=16)
    return out


# -- 1. table --json / --md ---------------------------------------------------------------------

@pytest.mark.parametrize("flag, rel", [("--json", "zarr.json"), ("--md", "entries/new.md"),
                                       ("--json", "t.json")])
def test_table_refuses_a_file_inside_the_store(store, capsys, flag, rel):
    before = digest(store)
    target = store / rel
    rc, _, err = cli(capsys, "table", "--store", store, "--step", "0", "--layer", "1", *FAST,
                     flag, target)
    refused(rc, err, "table", flag, target, "inside the zarr store", store)
    assert digest(store) == before
    assert open_capture(store).verify() == []


def test_table_replaces_only_an_earlier_table(tmp_path, capsys):
    mine_json, mine_md = tmp_path / "mine.json", tmp_path / "notes.md"
    mine_json.write_text('{"mine": 1}')
    mine_md.write_text("# my notes\n")
    args = ["table", "--synthetic", "small", *FAST]
    for flag, path in (("--json", mine_json), ("--md", mine_md)):
        rc, _, err = cli(capsys, *args, flag, path)
        refused(rc, err, "table", flag, path, "not an earlier")
    assert mine_json.read_text() == '{"mine": 1}' and mine_md.read_text() == "# my notes\n"
    # the same command again into its own files replaces them; an empty file holds nothing
    t_json, t_md = tmp_path / "t.json", tmp_path / "t.md"
    t_json.touch()
    for _ in range(2):
        assert cli(capsys, *args, "--json", t_json, "--md", t_md)[0] == 0
    assert "boundaries" in json.loads(t_json.read_text())
    # a table of the other kind is not replaced; nor may both flags name one file
    rc, _, err = cli(capsys, *args, "--json", t_md)
    refused(rc, err, "table", "--json", t_md, "not an earlier table JSON")
    rc, _, err = cli(capsys, *args, "--json", tmp_path / "x", "--md", tmp_path / "x")
    refused(rc, err, "table", "--md", tmp_path / "x", "same file as --json")
    assert not (tmp_path / "x").exists()


# -- 2. report / scan-report / demo -------------------------------------------------------------

def test_report_refuses_a_users_file_and_overwrites_only_an_earlier_report(store, tmp_path,
                                                                           capsys):
    args = ["report", store, *FAST, "--formats", "html", "--out"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my own report\n")
    before = digest(mine)
    rc, _, err = cli(capsys, *args, mine)
    refused(rc, err, "report", "--out", mine, "already holds report.md", "--overwrite")
    rc, _, err = cli(capsys, *args, mine, "--overwrite")
    refused(rc, err, "report", "--out", mine, mine / "report.json", "choose a new folder")
    assert digest(mine) == before
    # an earlier report: refused again without --overwrite, replaced (only its files) with it
    out = tmp_path / "r"
    assert cli(capsys, *args, out)[0] == 0
    (out / "notes.txt").write_text("mine")
    before = digest(out)
    rc, _, err = cli(capsys, *args, out)
    refused(rc, err, "report", "--out", out, "already holds report.md")
    assert digest(out) == before
    assert cli(capsys, *args, out, "--overwrite")[0] == 0
    assert (out / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("rel", [".", "entries/report"])
def test_report_refuses_an_out_in_the_store(store, capsys, rel):
    before = digest(store)
    out = store / rel
    rc, _, err = cli(capsys, "report", store, *FAST, "--formats", "html", "--out", out)
    refused(rc, err, "report", "--out", "inside the zarr store", store)
    assert digest(store) == before and open_capture(store).verify() == []


def test_scan_report_refuses_like_report(scan, tmp_path, capsys):
    before_scan = digest(scan)
    rc, _, err = cli(capsys, "scan-report", scan, "--formats", "html", "--out", scan / "rep")
    refused(rc, err, "scan-report", "--out", "inside the zarr store", scan)
    assert digest(scan) == before_scan
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my own report\n")
    for extra in ([], ["--overwrite"]):
        rc, _, err = cli(capsys, "scan-report", scan, "--formats", "html", "--out", mine, *extra)
        refused(rc, err, "scan-report", "--out", mine)
    assert (mine / "report.md").read_text() == "my own report\n"
    out = tmp_path / "rep"
    assert cli(capsys, "scan-report", scan, "--formats", "html", "--out", out)[0] == 0
    rc, _, err = cli(capsys, "scan-report", scan, "--formats", "html", "--out", out)
    refused(rc, err, "scan-report", "--out", out, "already holds report.md")
    assert cli(capsys, "scan-report", scan, "--formats", "html", "--out", out,
               "--overwrite")[0] == 0


def test_demo_replaces_its_own_results_and_refuses_a_users_file(store, tmp_path, capsys):
    out = tmp_path / "demo"
    # what an earlier demo left: its table files and its report (a second `make demo`)
    assert cli(capsys, "table", "--synthetic", "small", *FAST, "--json",
               out / "accuracy_table.json", "--md", out / "accuracy_table.md")[0] == 0
    assert cli(capsys, "report", store, *FAST, "--formats", "html", "--out",
               out / "report")[0] == 0
    # a user's file under a name the demo writes is refused before any work, even inside report/
    for rel in ("accuracy_table.md", "report/report.json"):
        user = out / rel
        saved = user.read_bytes()
        user.write_text("mine\n")
        before = digest(out)
        rc, _, err = cli(capsys, "demo", "--out", out, "--quick")
        refused(rc, err, "demo", "--out", out, out / rel.split("/")[0], "--overwrite")
        assert digest(out) == before
        user.write_bytes(saved)
    (out / "notes.txt").write_text("mine")
    assert cli(capsys, "demo", "--out", out, "--quick")[0] == 0
    assert (out / "accuracy_table.md").read_text().startswith("### Smooth Attention")
    assert (out / "notes.txt").read_text() == "mine"
    rc, _, err = cli(capsys, "demo", "--out", store / "demo", "--quick")
    refused(rc, err, "demo", "--out", "inside the zarr store")
    assert not (store / "demo").exists()


def test_a_run_interrupted_midway_is_still_its_own_for_overwrite_and_demo(store, tmp_path,
                                                                          capsys):
    """The result's record (report.json) is written last; an interrupted run leaves the folder's
    writing mark instead, so --overwrite, and a second demo, still know its partial files."""
    from workbench.cli_args import WRITING_MARK, writing_mark

    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):
        with writing_mark(out, "report"):
            (out / "report.md").write_text("half a report\n")
            raise KeyboardInterrupt
    assert (out / WRITING_MARK).is_file()
    args = ["report", store, *FAST, "--formats", "html", "--out", out]
    rc, _, err = cli(capsys, *args)
    refused(rc, err, "report", "--out", out, "already holds report.md", "--overwrite")
    assert cli(capsys, *args, "--overwrite")[0] == 0
    assert json.loads((out / "report.json").read_text()) and not (out / WRITING_MARK).exists()
    demo = tmp_path / "demo"
    with pytest.raises(KeyboardInterrupt):
        with writing_mark(demo / "report", "demo"):
            (demo / "report" / "report.md").write_text("half\n")
            raise KeyboardInterrupt
    assert cli(capsys, "demo", "--out", demo, "--quick")[0] == 0
    assert not (demo / "report" / WRITING_MARK).exists()


# -- 3. compare --recipes: distinct folders ------------------------------------------------------

def test_compare_gives_clashing_recipe_names_distinct_folders(tmp_path, capsys):
    from workbench.recipes import get_recipe

    pa, pb = tmp_path / "pa" / "plan.json", tmp_path / "pb" / "plan.json"
    for p, name in ((pa, "fp8_dense"), (pb, "fp8_sol_kv_corrected")):
        p.parent.mkdir()
        p.write_text(get_recipe(name).to_json())
    out = tmp_path / "cmp"
    assert cli(capsys, "compare", "--recipes", f"bf16,{pa},{pb}", "--model", "h3-tiny",
               "--steps", "2", "--quiet", "--out", out)[0] == 0
    specs = {json.loads((out / d / "config.json").read_text())["recipe_string"]
             for d in ("plan", "plan-2")}
    assert specs == {get_recipe("fp8_dense").to_string(),
                     get_recipe("fp8_sol_kv_corrected").to_string()}
    table = (out / "table.md").read_text()
    links = re.findall(r"`([^`]+/side_by_side\.mp4)`", table)
    assert sorted(links) == ["compare_plan-2/side_by_side.mp4", "compare_plan/side_by_side.mp4"]
    assert all((out / link).is_file() for link in links)
    assert json.loads((out / "compare.json").read_text())["folders"][str(pb)] == "plan-2"
    # a clip folder never takes another recipe's compare_ folder name
    from workbench.generate.compare import clip_folder_names

    assert clip_folder_names(["bf16", "x/compare_bf16.json"]) == {
        "bf16": "bf16", "x/compare_bf16.json": "compare_bf16-2"}
    rc, _, err = cli(capsys, "compare", "--recipes", "bf16,bf16", "--model", "h3-tiny",
                     "--steps", "2", "--quiet", "--out", tmp_path / "twice")
    refused(rc, err, "compare", "'bf16' is given twice")


# -- 4. --overwrite replaces only an earlier result ----------------------------------------------

def test_generate_overwrite_never_replaces_a_users_config(tmp_path, capsys):
    g = tmp_path / "g"
    g.mkdir()
    (g / "config.json").write_text('{"mine": 1}')
    (g / "video.mp4").write_bytes(b"my video")
    before = digest(g)
    args = ["generate", "--model", "h3-tiny", "--steps", "2", "--quiet", "--overwrite", "--out"]
    rc, _, err = cli(capsys, *args, g)
    refused(rc, err, "generate", "--out", g / "config.json", "--overwrite replaces only")
    assert digest(g) == before
    # an earlier clip is still replaced by --overwrite
    clip = tmp_path / "clip"
    assert cli(capsys, *args, clip)[0] == 0
    assert cli(capsys, *args, clip, "--seed", "3")[0] == 0
    assert json.loads((clip / "config.json").read_text())["seed"] == 3
    # compare: two clip folders into a user's folder, and --recipes into one
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "table.md").write_text("my table\n")
    before = digest(mine)
    rc, _, err = cli(capsys, "compare", clip, clip, "--out", mine, "--overwrite")
    refused(rc, err, "compare", "--out", mine / "metrics.json")
    rc, _, err = cli(capsys, "compare", "--recipes", "bf16,fp8_dense", "--model", "h3-tiny",
                     "--steps", "2", "--quiet", "--out", mine, "--overwrite")
    refused(rc, err, "compare", "--out", mine / "compare.json")
    assert digest(mine) == before


def test_generate_and_compare_refuse_an_out_inside_a_store(store, tmp_path, capsys):
    before = digest(store)
    inner = store / "entries" / "clip"
    rc, _, err = cli(capsys, "generate", "--model", "h3-tiny", "--steps", "2", "--quiet",
                     "--out", inner)
    refused(rc, err, "generate", "--out", inner, "inside the zarr store")
    rc, _, err = cli(capsys, "compare", "--recipes", "bf16,fp8_dense", "--model", "h3-tiny",
                     "--steps", "2", "--quiet", "--out", inner)
    refused(rc, err, "compare", "--out", inner, "inside the zarr store")
    assert digest(store) == before


def test_bench_report_files_are_checked_before_any_gpu_work(store, tmp_path, capsys):
    """``workbench bench`` (and ``bench sparse`` / ``bench dit``) refuse --json / --markdown
    paths inside a store or naming a file that is not an earlier bench output, at parse time."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    mine = tmp_path / "mine.md"
    mine.write_text("# my page\n")
    before = digest(store), notes.read_text(), mine.read_text()
    cases = [(["bench", "--json", store / "zarr.json"], "inside the zarr store"),
             (["bench", "--json", notes], "not an earlier bench report"),
             (["bench", "--markdown", notes], "not a markdown (.md) file"),
             (["bench", "sparse", "--json", notes], "not an earlier bench report"),
             (["bench", "sparse", "--markdown", mine], "not an earlier bench table"),
             (["bench", "dit", "--markdown", store / "t.md"], "inside the zarr store")]
    for args, needle in cases:
        rc, _, err = cli(capsys, *args)
        assert rc == 2 and needle in err and "Traceback" not in err, (args, err)
    assert (digest(store), notes.read_text(), mine.read_text()) == before


def test_generate_refuses_a_store_as_out_and_a_plain_zarr_json_is_no_store(store, tmp_path,
                                                                          capsys):
    before = digest(store)
    rc, _, err = cli(capsys, "generate", "--model", "h3-tiny", "--steps", "2", "--quiet",
                     "--out", store)
    refused(rc, err, "generate", "--out", store, "is or lies inside the zarr store")
    assert digest(store) == before
    # a project folder that merely has a file named zarr.json is not a store
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "zarr.json").write_text('{"mine": true}')
    rc, _, err = cli(capsys, "generate", "--model", "h3-tiny", "--steps", "2", "--quiet",
                     "--out", proj / "clip")
    assert rc == 0, err


# -- 6. findings of a review (2026-12-03): each reproduced first, on the tree before its fix ------

def test_a_failed_command_leaves_no_mark_that_vouches_for_a_users_files(store, tmp_path, capsys):
    """A command that fails before writing anything leaves no writing mark; a mark vouches only
    for its own command and for files written after it. Before: `compare A B --out U` failing
    on its inputs left U/.workbench-writing, and `report --overwrite` then replaced the user's
    U/report.md (and `demo` a user's report folder, without --overwrite)."""
    import time

    from workbench.cli_args import WRITING_MARK, writing_mark

    u = tmp_path / "U"
    u.mkdir()
    (u / "report.md").write_text("my notes\n")
    (tmp_path / "A").mkdir()
    (tmp_path / "B").mkdir()
    time.sleep(0.3)
    rc, _, err = cli(capsys, "compare", tmp_path / "A", tmp_path / "B", "--out", u)
    assert rc == 2 and not (u / WRITING_MARK).exists()
    args = ["report", store, *FAST, "--formats", "html", "--out", u, "--overwrite"]
    rc, _, err = cli(capsys, *args)
    refused(rc, err, "report", "--out", u, "report.json is missing")
    assert (u / "report.md").read_text() == "my notes\n"
    # a mark another command left while writing (its own file) does not vouch for report.md
    with pytest.raises(KeyboardInterrupt):
        with writing_mark(u, "compare"):
            (u / "table.md").write_text("half a table\n")
            raise KeyboardInterrupt
    assert (u / WRITING_MARK).is_file()
    refused(*cli(capsys, *args)[::2], "report", "--out", u, "report.json is missing")
    # a report's own mark, but report.md older than it: the user's, still refused
    (u / WRITING_MARK).unlink()
    with pytest.raises(KeyboardInterrupt):
        with writing_mark(u, "report"):
            (u / "figures").mkdir()
            (u / "figures" / "a.html").write_text("half\n")
            raise KeyboardInterrupt
    refused(*cli(capsys, *args)[::2], "report", "--out", u, "report.json is missing")
    assert (u / "report.md").read_text() == "my notes\n"
    # demo: a user's report folder next to a stale mark of another command is not the demo's
    d = tmp_path / "D"
    (d / "report").mkdir(parents=True)
    (d / "report" / "report.md").write_text("my draft\n")
    time.sleep(0.3)
    with pytest.raises(KeyboardInterrupt):
        with writing_mark(d / "report", "compare"):
            (d / "report" / "x.md").write_text("x\n")
            raise KeyboardInterrupt
    refused(*cli(capsys, "demo", "--out", d, "--quick")[::2], "demo",
            "was not written by an earlier `workbench demo`")
    assert (d / "report" / "report.md").read_text() == "my draft\n"


def test_demo_overwrite_refuses_a_store_as_its_report_folder(store, tmp_path, capsys):
    """`demo --out D --overwrite` with a capture store at D/report: refused naming the store
    (before: report.md, report.json and figures/ were written into the store)."""
    d = tmp_path / "D"
    d.mkdir()
    shutil.copytree(store, d / "report")
    before = digest(d / "report")
    rc, _, err = cli(capsys, "demo", "--out", d, "--quick", "--overwrite")
    refused(rc, err, "demo", d / "report", "inside the zarr store")
    assert digest(d / "report") == before


def test_table_json_through_a_link_into_a_store_is_refused(store, tmp_path, capsys):
    """A --json path that is a symbolic link to a file inside a store: refused (before: the
    table was written into the store, which `capture --overwrite` then refused as foreign)."""
    before = digest(store)
    link = tmp_path / "t.json"
    link.symlink_to(store / "table.json")
    rc, _, err = cli(capsys, "table", "--synthetic", "small", "--queries", "8", "--json", link)
    refused(rc, err, "table", "--json", link, "inside the zarr store")
    assert digest(store) == before and not (store / "table.json").exists()


def test_table_md_keeps_a_users_notes_under_the_tables_heading(tmp_path, capsys):
    """A user's markdown that starts with the table's heading is not an earlier table: refused
    (before: replaced, losing the text below the heading); an earlier table is still replaced."""
    from workbench.report.accuracy_table import TABLE_HEADING

    draft = tmp_path / "draft.md"
    draft.write_text(f"{TABLE_HEADING}\n\nMy PR draft, to be kept.\n")
    rc, _, err = cli(capsys, "table", "--synthetic", "small", "--queries", "8", "--md", draft)
    refused(rc, err, "table", "--md", draft, "not an earlier markdown table")
    assert "My PR draft" in draft.read_text()
    md = tmp_path / "t.md"
    for _ in range(2):  # a table, then the same table again: its own file, replaced
        assert cli(capsys, "table", "--synthetic", "small", "--queries", "8", "--md", md)[0] == 0
    assert md.read_text().startswith(TABLE_HEADING)


def test_generate_refuses_an_out_nested_with_its_capture(tmp_path, capsys):
    """--out and --capture the same folder or one inside the other: refused naming both, nothing
    written (before: the clip's files landed inside the new capture store)."""
    for out, cap in (("G1", "G1"), ("G2/clip", "G2"), ("G3", "G3/cap.zarr")):
        rc, _, err = cli(capsys, "generate", "--model", "h3-tiny", "--steps", "2", "--quiet",
                         "--out", tmp_path / out, "--capture", tmp_path / cap)
        refused(rc, err, "generate", "--capture", tmp_path / cap, "--out", "nested")
        assert not (tmp_path / cap).exists() or not any((tmp_path / cap).iterdir())
