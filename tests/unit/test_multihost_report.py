"""ps/bench/multihost_report.py: a CSV of runs reads back as the runs it was written from,
and one written before the later columns existed reads with them 0 (servers: one per host)."""
import csv

from ps.bench.multihost_report import FLOATS, Run, read_csv, write_csv


def test_runs_written_to_a_csv_read_back_equal(tmp_path):
    runs = [Run("ps", 0, 3, 1.2, 1.0, 1.1, 0.83, 150.5, 0.4, 1.15, 2, 0.1, 0.05, 0.7, 0.2),
            Run("native", 1, 3, 1.5, 1.0, 1.1, 0.67, 151.0, 0.5, 1.15, 3)]
    write_csv(str(tmp_path / "runs.csv"), runs)
    assert read_csv(str(tmp_path / "runs.csv")) == runs


def test_a_csv_from_before_the_later_columns_reads_with_them_zero(tmp_path):
    path = tmp_path / "old.csv"
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["impl", "rep", "hosts", *FLOATS[:6]])
        w.writeheader()
        w.writerow({"impl": "ps", "rep": 0, "hosts": 4, "step_s": 1.5, "compute_s": 1.0, "bound_s": 1.2,
                    "efficiency": 0.66, "mb_per_host_step": 200.0, "cpu_load": 0.3})
    (run,) = read_csv(str(path))
    assert run == Run("ps", 0, 4, 1.5, 1.0, 1.2, 0.66, 200.0, 0.3, tight_s=0.0, servers=4)
