"""The soak's memory verdict (ps/bench/soak.py): which samples it compares."""
from ps.bench.soak import rss_window


def test_rss_is_compared_from_10s_in_to_the_last_sample_with_every_process_alive():
    samples = [(t, {"worker": [100 + t, 200 + t], "server": [50, 50]}) for t in range(0, 30, 3)]
    samples.append((30, {"worker": [140, 0], "server": [50, 51]}))     # worker 1 has exited
    early, late = rss_window(samples, "worker")
    assert early == [112, 212] and late == [127, 227]                 # t = 12 and t = 27
    assert rss_window(samples, "server") == ([50, 50], [50, 51])


def test_a_run_shorter_than_10s_compares_from_its_first_sample_and_a_role_never_alive_gives_nothing():
    samples = [(0.5, {"worker": [10], "server": [0]}), (1.5, {"worker": [12], "server": [0]})]
    assert rss_window(samples, "worker") == ([10], [12])
    assert rss_window(samples, "server") == ([], [])
