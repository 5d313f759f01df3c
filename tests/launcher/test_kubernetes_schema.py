"""The manifests against Kubernetes' own API schemas, strict (no field the API does not
know), with kubernetes-validate (the test extra): every object, with and without restarts
and CURVE, for 1.29, 1.31, 1.33 and the newest schemas it bundles; the fallbacks for older
clusters against theirs; and the issue's own command line, run as a user would."""
from __future__ import annotations

import subprocess
import sys

import pytest

from launcher import kubernetes as k8s
from launcher.launch import parse_args

kv = pytest.importorskip("kubernetes_validate")
yaml = pytest.importorskip("yaml")

NEWEST = ".".join(kv.latest_version().split(".")[:2])
VERSIONS = ["1.29", "1.31", "1.33", NEWEST]
OLDER = ["1.25", "1.26", "1.27", "1.28"]
COMMAND = ["--launcher", "kubernetes", "-n", "2", "-s", "2", "--image", "python:3.11", "--max-restarts", "2",
           "--dry-run", "python", "train.py"]


def objects_for(version: str | None, restarts: int, curve: bool, owner: str | None) -> list[dict]:
    spec = parse_args(["--launcher", "kubernetes", "-n", "3", "-s", "2", "--image", "python:3.11",
                       "--max-restarts", str(restarts), "--worker-resources", "cpu=2,memory=4Gi,nvidia.com/gpu=1",
                       "--env", "OMP_NUM_THREADS:4", "python", "train.py"], {})
    files = (("job.key", b"k" * 43),) + ((("curve.secret", b"c" * 32),) if curve else ())
    features = k8s.Features(None if version is None else k8s.parse_version(version))
    return k8s.manifests(k8s.plan(spec, "default", features, files), owner)


def check(objects: list[dict], version: str) -> None:
    for obj in objects:
        try:
            used = kv.validate(obj, version, strict=True)
        except kv.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} against {version}: {path}: {exc.message}")
        assert used == version, f"validated against {used}, not {version}"


def test_the_mode_mpi_manifests_validate_strictly():
    spec = parse_args(["--launcher", "kubernetes", "-n", "3", "--mode", "mpi", "--image", "python:3.11",
                       "python", "train.py"], {})
    check(k8s.manifests(k8s.plan(spec, "default", k8s.Features(None), (("job.key", b"k" * 43),))), NEWEST)


def test_the_newest_bundled_schemas_are_at_least_1_33():
    assert tuple(map(int, NEWEST.split("."))) >= (1, 33)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("restarts", [0, 2])
@pytest.mark.parametrize("curve", [False, True])
def test_the_manifests_validate_strictly(version, restarts, curve):
    check(objects_for(None, restarts, curve, "0b9a6a56-0c4f-4a8e-9a31-5a1a63c0f1de"), version)
    check(objects_for(None, restarts, curve, None), version)


@pytest.mark.parametrize("version", OLDER)
def test_the_fallback_for_an_older_cluster_validates_against_its_version(version):
    check(objects_for(version, 2, True, "uid-1"), version)
    check(objects_for(version, 0, False, None), version)


@pytest.mark.process
def test_the_issue_command_prints_manifests_that_validate_strictly():
    """#47's first done-when line, exactly as a user types it."""
    out = subprocess.run([sys.executable, "-m", "ps.launch", *COMMAND], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert sorted(d["kind"] for d in docs) == ["Job", "Job", "Job", "Secret", "Service", "Service"]
    for version in VERSIONS:
        check(docs, version)
