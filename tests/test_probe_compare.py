"""`ecgpos probe --compare` of real probe folders made under different conditions: what is refused,
what is flagged in summary.md."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from refusal_helpers import ctrl_c_when_renaming
from tiny_runs import cli


@pytest.fixture(scope="module")
def probe_folder(shared_data, tmp_path_factory):
    """make(name, *flags, splits=None) -> a real ptbxl-super probe folder (tiny random encoder, 2 seeds,
    2 epochs, full labels); features are cached across the module's runs."""
    root = tmp_path_factory.mktemp("compare")

    def make(name: str, *flags: str, splits: Path | None = None) -> Path:
        out = root / name
        args = ["probe", "--encoder", "random:tiny/level0", "--name", name, "--task", "ptbxl-super"]
        args += ["--data-root", shared_data, "--splits", splits or shared_data / "merl_splits"]
        args += ["--fractions", "100", "--seeds", "2", "--epochs", "2", "--workers", "1"]
        assert cli(*args, "--cache-dir", root / "cache", "--out", out, *flags) == 0
        return out

    make.root = root
    return make


def _splits(shared_data: Path, folder: Path, edit) -> Path:
    """A copy of MERL's PTB-XL super-class splits whose test CSV is passed through `edit`."""
    shutil.copytree(shared_data / "merl_splits" / "ptbxl" / "super_class", folder / "ptbxl" / "super_class")
    test = folder / "ptbxl" / "super_class" / "ptbxl_super_class_test.csv"
    edit(pd.read_csv(test)).to_csv(test, index=False)
    return folder


def _compare(capsys, *folders: Path) -> tuple[int, str, str]:
    capsys.readouterr()  # drop what the probe runs printed
    rc = cli("probe", "--compare", *folders)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_compare_refuses_a_paired_difference_over_differently_labelled_test_records(capsys, shared_data, probe_folder):
    def swap(t: pd.DataFrame) -> pd.DataFrame:
        t[["NORM", "MI"]] = t[["MI", "NORM"]].to_numpy()
        return t

    base = probe_folder("base")
    other = probe_folder("swapped", splits=_splits(shared_data, probe_folder.root / "splits-swapped", swap))
    rc, _, err = _compare(capsys, base, other)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("ecgpos probe: error: --compare: 'swapped' and 'base' label") and "different splits" in err


def test_compare_counts_and_flags_test_records_left_out_of_a_paired_difference(capsys, shared_data, probe_folder):
    def few(t: pd.DataFrame) -> pd.DataFrame:
        present = t[t["ecg_id"] <= 200]  # the sample holds PTB-XL records 1..200
        return pd.concat([present.iloc[:10], t[t["ecg_id"] > 200]])

    base = probe_folder("base2")
    small = probe_folder("small", splits=_splits(shared_data, probe_folder.root / "splits-small", few))
    n_base = int(pd.read_csv(base / "results.csv")["n_test"].iloc[0])
    rc, out, err = _compare(capsys, base, small)
    assert rc == 0, err
    assert f"(on 10 of {n_base} records)" in out
    assert f"**small − base2, Super: {n_base - 10} of the {n_base} test records are scored by only one" in out
    # the table's own rows are over different test sets too: said beside the table
    assert "**Rows over different test sets**" in out
    assert f"- ptbxl-super, 100% labels: test records base2 {n_base}, small 10" in out
    # every folder's records stay accounted for in the merged summary, under the merged labels
    assert "| ptbxl-super (base2) | test | 2158 |" in out and "| ptbxl-super (small) | test |" in out
    assert f"| 0 | 0 | {n_base} |" in out and "| 0 | 0 | 10 |" in out
    merged = probe_folder.root / "merged-small"
    rc = cli("probe", "--compare", base, small, "--out", merged)
    diffs = pd.read_csv(merged / "differences.csv")
    assert diffs[["n_test", "left_out"]].to_numpy().tolist() == [[10, n_base - 10]]
    # the merged folder keeps each encoder's own test records with its scores, so it compares as its parts
    from ecgpos.export.probe_scores import load_scores

    sets = {s.encoder: s for s in load_scores(merged)}
    assert (len(sets["small"].keys), sets["small"].scores.shape[1]) == (10, 10)
    assert (len(sets["base2"].keys), sets["base2"].scores.shape[1]) == (n_base, n_base)
    # PTB-XL's test split has patients with several recordings: its intervals resample patients; the
    # 10 records the difference rests on are 10 patients', so it resamples records
    assert len(sets["base2"].patients) == n_base and len(set(sets["base2"].patients)) < n_base
    assert set(pd.read_csv(base / "results.csv")["bootstrap_unit"]) == {"patient"}
    assert (
        "resamples of the test patients (each drawn with all of their test records)"
        in (base / "summary.md").read_text()
    )
    assert diffs["bootstrap_unit"].tolist() == ["record"]
    rc, out, err = _compare(capsys, merged)
    assert rc == 0, err
    assert f"(on 10 of {n_base} records)" in out
    assert "| ptbxl-super (small) | test |" in out  # the merged folder keeps the counts of its parts


def test_compare_notes_a_folder_without_test_scores(capsys, probe_folder):
    base = probe_folder("base3")
    bare = probe_folder("bare")
    (bare / "test_scores.npz").unlink()
    rc, out, err = _compare(capsys, base, bare)
    assert rc == 0, err
    assert f"- {bare.resolve()}: no test_scores.npz, so its rows are in no paired difference" in out


def test_compare_flags_folders_probed_under_different_protocols(capsys, probe_folder):
    three = probe_folder("three-epochs", "--epochs", "3")
    two = probe_folder("two-epochs")
    rc, out, err = _compare(capsys, two, three)
    assert rc == 0, err
    assert "## Protocol differences between the merged folders" in out
    assert "- **epochs**: two-epochs: 2; three-epochs: 3" in out
    assert "**seeds**" not in out and "**data_root**" not in out  # only what differs is named
    assert "## Protocol\n" not in out  # no single protocol to state
    rc, out, err = _compare(capsys, two, probe_folder("two-epochs-again"))
    assert rc == 0, err
    assert "Protocol differences" not in out
    assert "## Protocol\n" in out and "batch 16, 2 epochs" in out  # the one protocol, stated once


def test_compare_keeps_two_encoders_under_one_label_apart(capsys, shared_data, probe_folder):
    # two different encoders both named "level1", probed on different tasks (so no row clashes)
    first = probe_folder("named-first")
    args = ["probe", "--encoder", "random:tiny/level1", "--name", "named-first", "--task", "cpsc2018"]
    args += ["--data-root", shared_data, "--splits", shared_data / "merl_splits", "--fractions", "100"]
    args += ["--seeds", "1", "--epochs", "1", "--workers", "1", "--cache-dir", probe_folder.root / "cache"]
    second = probe_folder.root / "other-weights"
    assert cli(*args, "--out", second) == 0
    rc, out, err = _compare(capsys, first, second)
    assert rc == 0, err
    assert "| named-first | " in out and "| named-first [other-weights] | — | " in out
    assert "renamed because an earlier folder uses that label for other encoder weights" in out


def test_reference_flags_our_differences_over_a_smaller_test_set(capsys, shared_data, probe_folder):
    """The published numbers are over MERL's whole test split; the sample data holds 29 of its 2158
    super-class records, so `ours − published` compares different test sets and says so. A label that
    names no published row is compared with the row of its architecture (a level-0 encoder: the paper's
    Stage 0), also after a --compare of a --compare."""
    from ecgpos.probes.shared.published import PUBLISHED_TEST_RECORDS, read_reference
    from ecgpos.probes.shared.tasks import SPLITS, read_splits, resolve_task

    for task, size in PUBLISHED_TEST_RECORDS.items():  # the constants are the split files' sizes
        tables = read_splits(resolve_task(task), shared_data / "merl_splits")
        assert len(tables[SPLITS[-1]].records) == size, task
    assert set(PUBLISHED_TEST_RECORDS) <= set(read_reference("paper")[0].columns)
    folder = probe_folder("against-paper")
    capsys.readouterr()
    assert cli("probe", "--compare", folder, "--reference", "paper") == 0
    out = capsys.readouterr().out
    assert "| against-paper − Stage 0 (published) | " in out and " †" in out
    assert "prints the largest test AUROC over its epochs" in out  # how the published numbers were chosen
    assert "**† Our test set is smaller than the published one**" in out
    assert "against-paper, Super: 29 of 2158" in out
    merged = probe_folder.root / "against-paper-merged"
    assert cli("probe", "--compare", folder, "--out", merged) == 0
    capsys.readouterr()
    assert cli("probe", "--compare", merged, "--reference", "paper") == 0
    assert "| against-paper − Stage 0 (published) | " in capsys.readouterr().out


def _edited_copy(folder: Path, dest: Path, edit) -> Path:
    """A copy of a probe folder whose results.csv is passed through `edit` (test_scores.npz kept)."""
    shutil.copytree(folder, dest)
    rows = pd.read_csv(dest / "results.csv")
    edit(rows).to_csv(dest / "results.csv", index=False)
    return dest


def test_compare_and_export_refuse_results_that_disagree_with_the_stored_test_scores(
    capsys, probe_folder, tiny_run, tmp_path
):
    """A hand-edited test_auroc, or a results.csv left from another run, was merged and tabulated as if
    the stored test scores said so."""
    from refusal_helpers import one_line_error, run

    base = probe_folder("checked")
    assert _compare(capsys, base)[0] == 0  # the folder as the probe wrote it passes

    def bump(rows: pd.DataFrame) -> pd.DataFrame:
        rows.loc[1, "test_auroc"] = float(rows.loc[1, "test_auroc"]) + 0.01
        return rows

    edited = _edited_copy(base, tmp_path / "edited", bump)
    written = float(pd.read_csv(edited / "results.csv").loc[1, "test_auroc"])
    rc, _, err = _compare(capsys, edited)
    line = one_line_error(rc, err, "probe", f"{edited}: results.csv disagrees with test_scores.npz")
    assert "task ptbxl-super, fraction 1, label 'checked', seed 1" in line and repr(written) in line, line
    rc, _, err = run(capsys, "export", "--run-dir", tiny_run, "--out", tmp_path / "enc", "--probe-results", edited)
    one_line_error(rc, err, "export", "results.csv disagrees with test_scores.npz")
    assert not (tmp_path / "enc").exists()

    # a results.csv from another probe run, next to this folder's scores
    stale = _edited_copy(base, tmp_path / "stale", lambda rows: rows)
    shutil.copyfile(probe_folder("other-run", "--epochs", "3") / "results.csv", stale / "results.csv")
    rows = pd.read_csv(stale / "results.csv")
    rows["encoder"] = "checked"
    rows.to_csv(stale / "results.csv", index=False)
    rc, _, err = _compare(capsys, stale)
    one_line_error(rc, err, "probe", "results.csv disagrees with test_scores.npz")

    # a row of a seed without stored scores (seed 7) is one the probe never ran: its probe.json names seeds 0-1
    def extra_seed(rows: pd.DataFrame) -> pd.DataFrame:
        row = rows.iloc[[0]].assign(seed=7, test_auroc=0.5)
        return pd.concat([rows, row], ignore_index=True)

    more = _edited_copy(base, tmp_path / "more", extra_seed)
    rc, _, err = _compare(capsys, more)
    one_line_error(rc, err, "probe", "seed 7 is not one of the 2 seeds (0 to 1) its probe.json names")


def test_differences_table_titles_a_custom_task_as_the_results_table_does() -> None:
    """A custom task's column is its folder name in the paired-difference table, as in the results table."""
    from ecgpos.probes.shared.intervals import differences_markdown

    diffs = pd.DataFrame(
        [dict(encoder="b", baseline="a", task="custom:rhythm", fraction=1.0, difference=0.1, low=0.0, high=0.2)]
        + [dict(encoder="b", baseline="a", task="custom:rhythm2", fraction=1.0, difference=0.1, low=0.0, high=0.2)]
    ).assign(n_test=10, left_out=[0, 20], bootstrap=1000)
    text = differences_markdown(diffs, 1000)
    assert "| Pair | rhythm | rhythm2 |" in text, text
    assert "custom:" not in text, text


def test_probe_and_compare_remove_what_killed_runs_of_this_host_left(capsys, probe_folder):
    """Temporary files of a dead process of this host in --out and --cache-dir go; another host's stay."""
    from ecgpos.files import host_tag

    finished = subprocess.Popen(["true"])
    finished.wait()  # its pid no longer runs
    out, cache, merged = (probe_folder.root / name for name in ("killed", "cache", "merged-killed"))
    dead = [
        out / f".results.csv.{host_tag()}.{finished.pid}.tmp",
        cache / f".ptbxl-0123.npz.{host_tag()}.{finished.pid}.tmp.npz",
        merged / f".differences.csv.{host_tag()}.{finished.pid}.tmp",
    ]
    other_host = out / f".summary.md.{host_tag()}-other-node.{finished.pid}.tmp"
    for path in (*dead, other_host):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half a file\n")
    assert probe_folder("killed") == out
    assert [p.exists() for p in dead[:2]] == [False, False] and other_host.exists()
    capsys.readouterr()
    assert cli("probe", "--compare", out, probe_folder("base4"), "--out", merged) == 0
    assert not dead[2].exists()


def test_a_probe_interrupted_while_writing_leaves_no_earlier_run_beside_its_files(
    probe_folder, shared_data, monkeypatch
):
    """A second probe into one --out, stopped by Ctrl-C as it renames summary.md into place: the
    earlier run's summary.md and probe.json used to stay beside the new results.csv, and
    `export --probe-results` put the earlier encoder's table into the new encoder's model card."""
    from ecgpos.export.card import probe_section

    out = probe_folder("first")
    args = ["probe", "--encoder", "random:tiny/level0", "--name", "second", "--task", "ptbxl-super"]
    args += ["--data-root", shared_data, "--splits", shared_data / "merl_splits", "--fractions", "100"]
    args += ["--seeds", "2", "--epochs", "2", "--workers", "1", "--cache-dir", probe_folder.root / "cache"]
    ctrl_c_when_renaming(monkeypatch, "summary.md")
    assert cli(*args, "--out", out) == 130
    monkeypatch.undo()
    assert not (out / "summary.md").exists() and not (out / "probe.json").exists()
    assert set(pd.read_csv(out / "results.csv")["encoder"]) == {"second"}
    section = probe_section(out)  # what a model card would show
    assert "second" in section and "first" not in section, section
    assert cli(*args, "--out", out) == 0
    assert '"label": "second"' in (out / "probe.json").read_text()


def test_compare_and_probe_into_one_out_never_leave_the_others_files(probe_folder, monkeypatch, capsys):
    """A --compare into its own earlier folder deletes that one's files before writing: stopped by Ctrl-C
    as it renames summary.md, it leaves no earlier summary.md or probe.json beside its merged results.
    A probe into a compare's folder, or a compare into a probe's, would delete the other's results: it is
    one line, and the folder is left as it was."""
    first, second = probe_folder("cmp-a"), probe_folder("cmp-b")
    out = probe_folder.root / "cmp-out"
    assert cli("probe", "--compare", first, "--out", out) == 0
    ctrl_c_when_renaming(monkeypatch, "summary.md")
    assert cli("probe", "--compare", first, second, "--out", out) == 130
    monkeypatch.undo()
    assert not (out / "summary.md").exists() and not (out / "probe.json").exists()
    assert set(pd.read_csv(out / "results.csv")["encoder"]) == {"cmp-a", "cmp-b"}
    assert cli("probe", "--compare", first, second, "--out", out) == 0
    assert (out / "differences.csv").is_file() and "cmp-a" in (out / "summary.md").read_text()
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(files) == [
        "differences.csv",
        "probe.json",
        "results.csv",
        "summary.md",
        "summary.png",
        "test_scores.npz",
    ]
    capsys.readouterr()
    with pytest.raises(AssertionError):  # the fixture's probe run exits 2
        probe_folder("cmp-out")
    assert "holds the results of `ecgpos probe --compare` (probe.json)" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    files = {p.name: p.read_bytes() for p in first.iterdir()}
    assert cli("probe", "--compare", second, "--out", first) == 2
    assert "holds the results of `ecgpos probe` (probe.json)" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in first.iterdir()} == files


def test_compare_without_a_bootstrap_gives_differences_without_nan_intervals(capsys, probe_folder):
    """--bootstrap 0 tabled every paired difference as `+0.0123 [+nan, +nan]` under a text about resamples."""
    first, second = probe_folder("nb-first"), probe_folder("nb-second")
    capsys.readouterr()
    assert cli("probe", "--compare", first, second, "--bootstrap", "0") == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower(), out
    assert "No intervals: --bootstrap 0." in out and "| nb-second − nb-first | +0.0000 |" in out


def test_paired_difference_over_different_class_counts_is_one_line() -> None:
    """Two custom tasks of one folder name with other class columns crashed with a numpy broadcast error."""
    import numpy as np

    from ecgpos.errors import EcgposError
    from ecgpos.export.probe_scores import ScoreSet
    from ecgpos.probes.shared.intervals import paired_differences

    keys = ["r0", "r1", "r2", "r3"]
    two = np.array([[0, 1], [1, 0], [1, 1], [0, 0]], np.uint8)
    three = np.concatenate([two, two[:, :1]], axis=1)
    sets = [
        ScoreSet("a", "custom:task", 1.0, [0], keys, two, np.zeros((1, 4, 2), np.float32)),
        ScoreSet("b", "custom:task", 1.0, [0], keys, three, np.zeros((1, 4, 3), np.float32)),
    ]
    with pytest.raises(EcgposError, match="'b' and 'a' score 3 and 2 classes of task custom:task"):
        paired_differences(sets, ["a", "b"], 10)


def test_export_takes_the_probe_results_of_its_own_encoder_only(capsys, tmp_path, probe_folder, tiny_run):
    """`export --probe-results` of another encoder's folder put that encoder's AUROCs in this model card."""
    from refusal_helpers import one_line_error, run

    own = probe_folder("own", "--encoder", tiny_run)
    other = probe_folder("another-encoder")  # a random-init encoder: other weights
    capsys.readouterr()  # what the probes printed
    rc, _, err = run(capsys, "export", "--run-dir", tiny_run, "--out", tmp_path / "enc", "--probe-results", own)
    assert rc == 0 and "warning" not in err, err
    assert "| own |" in (tmp_path / "enc" / "README.md").read_text()
    rc, _, err = run(capsys, "export", "--run-dir", tiny_run, "--out", tmp_path / "enc2", "--probe-results", other)
    one_line_error(rc, err, "export", f"--probe-results {other} probed other weights than the checkpoint exported")
    assert not (tmp_path / "enc2").exists()
    bare = tmp_path / "bare"  # a results.csv alone cannot tell which encoder it probed: said, not refused
    bare.mkdir()
    shutil.copyfile(own / "results.csv", bare / "results.csv")
    rc, _, err = run(capsys, "export", "--run-dir", tiny_run, "--out", tmp_path / "enc3", "--probe-results", bare)
    assert rc == 0 and "does not record which encoder it probed (no probe.json): not checked" in err, err


def test_compare_takes_a_probe_json_of_another_structure_as_an_unchecked_folder(capsys, probe_folder):
    """A probe.json that is valid JSON but not what a probe writes (an array; an object whose parts are of
    other types) was an AttributeError or TypeError traceback; it is read as unreadable JSON is: the folder's
    rows are merged and summary.md names its protocol as one that cannot be checked."""
    first, second = probe_folder("pj-first"), probe_folder("pj-second")
    for text in ("[]", '{"config": []}', '{"records": {"x": []}}', '{"sources": null}', '{"tasks": [[1]]}'):
        (second / "probe.json").write_text(text)
        capsys.readouterr()
        assert cli("probe", "--compare", first, second, "--bootstrap", "0") == 0, text
        out = capsys.readouterr().out
        assert "- **pj-second**: no readable probe.json (missing, damaged, or a hand-made or older folder)" in out
        assert "| pj-second − pj-first |" in out  # its rows are merged all the same


def test_compare_compares_each_protocols_own_settings_within_that_protocol():
    from ecgpos.probes.shared.provenance import protocol_section

    def linear(epochs: int, seeds: int) -> dict:
        return {"config": {"protocol": {"epochs": epochs, "lr": 0.001}, "seeds": seeds}, "bootstrap": 1000}

    def tuned(mode: str, seeds: int) -> dict:
        flat = {"fine-tuning": mode, "fine-tuning optimiser": '{"epochs": 10}'}
        return {"config": {"protocol": flat, "seeds": seeds}, "bootstrap": 1000}

    infos = {Path("a"): linear(100, 5), Path("b"): linear(100, 5), Path("ft"): tuned("finetune-full", 1)}
    text = protocol_section(infos)
    assert "- **seeds**: a: 5; b: 5; ft: 1" in text  # a setting both protocols have differs
    assert "**epochs**" not in text and "**lr**" not in text and "**fine-tuning" not in text  # not applicable
    infos |= {Path("c"): linear(3, 5), Path("lora"): tuned("finetune-lora:8", 1)}
    text = protocol_section(infos)
    assert "- **epochs**: a: 100; b: 100; c: 3\n" in text  # among the linear probes only
    assert "- **fine-tuning**: ft: finetune-full; lora: finetune-lora:8" in text.splitlines()
    assert "**lr**" not in text and "**fine-tuning optimiser**" not in text
