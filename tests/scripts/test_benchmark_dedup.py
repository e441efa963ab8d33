"""scripts/bench/benchmark_dedup.py runs end to end on a few thousand hashes (a smoke test, not a timing)."""

from tests import load_script


def test_benchmark_dedup_finds_the_planted_copies_and_agrees_with_brute_force():
    bench = load_script("benchmark_dedup")
    figures = bench.main(["--hashes", "4000", "--check", "300", "--radius", "10"])
    # 2% of the images are planted copies within the radius: each is a candidate (random pairs are rare), and
    # the verification keeps the copies (the benchmark asserts 95%) and rejects the random pictures.
    assert 80 <= figures["candidates"] < 120 and figures["seconds"] > 0
    assert figures["planted"] == 80 and 76 <= figures["verified"] <= 80
    assert figures["brute_force_check"].startswith("the same ")
