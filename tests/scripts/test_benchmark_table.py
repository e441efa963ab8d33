"""scripts/bench/benchmark_table.py runs end to end (tiny sizes, one run: a smoke test, not a timing)."""

import json

from tests import load_script


def test_benchmark_table_times_the_table_against_the_folders_on_the_same_samples(tmp_path):
    out = tmp_path / "table.json"
    result = load_script("benchmark_table").main(["--files", "200", "--classes", "4", "--tags", "5", "--runs", "1",
                                                  "--root", str(tmp_path / "tree"), "--json", str(out)])
    assert json.loads(out.read_text()) == result and result["rows"] == 200
    assert result["table_s"] > 0 and result["folder_s"] > 0 and result["multi_label_s"] > 0
    assert result["folder_bytes_per_row"] > 0 and result["table_bytes_per_row"] > 0
    assert (tmp_path / "tree/labels.csv").read_text().count("\n") == 201 and (tmp_path / "tree/tags.csv").is_file()
