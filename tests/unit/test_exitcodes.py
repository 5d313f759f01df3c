"""ps's exit statuses: what no restart can fix exits ps.exitcodes.CONFIG (the Kubernetes
launcher's podFailurePolicy fails the job on it), decided before any socket opens."""
from __future__ import annotations

import pytest

from ps import exitcodes
from ps.__main__ import main

ENV = {"DMLC_ROLE": "server", "DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9091",
       "DMLC_NUM_SERVER": "1", "DMLC_NUM_WORKER": "1"}


def test_the_fatal_code_is_none_that_python_a_shell_or_a_signal_uses():
    assert exitcodes.FATAL == (exitcodes.CONFIG,) == (78,)
    assert not set(exitcodes.FATAL) & {0, 1, 2, 126, 127} and all(c < 128 for c in exitcodes.FATAL)


@pytest.mark.parametrize("change, message", [
    ({"DMLC_NUM_WORKER": None}, "DMLC_NUM_WORKER is not set"),
    ({"DMLC_NUM_SERVER": "two"}, "DMLC_NUM_SERVER must be an integer, got 'two'"),
    ({"DMLC_ROLE": "boss"}, "DMLC_ROLE must be one of scheduler, server, worker, joint, got 'boss'"),
    ({"PS_HEARTBEAT_TIMEOUT": "0.5"}, "PS_HEARTBEAT_TIMEOUT (0.5) must be at least twice"),
    ({"DMLC_ROLE": "worker"}, "run your training script instead"),
])
def test_a_bad_environment_exits_config(change, message, capsys):
    env = {k: v for k, v in {**ENV, **change}.items() if v is not None}
    assert main(env) == exitcodes.CONFIG
    assert message in capsys.readouterr().err


def test_an_unreadable_or_short_secret_file_exits_config_before_the_role_starts(tmp_path, capsys):
    short = tmp_path / "short"
    short.write_text("abc")
    for name, path, message in (("PS_SECRET_FILE", str(short), "holds 3 bytes"),
                                ("PS_JOB_KEY_FILE", str(tmp_path / "missing"), "cannot be read")):
        assert main({**ENV, name: path}) == exitcodes.CONFIG
        assert f"{name}=" in (err := capsys.readouterr().err) and message in err, err


def test_a_bad_command_line_exits_config(capsys):
    assert main(argv=["--bogus"]) == exitcodes.CONFIG
    assert "usage: python -m ps" in capsys.readouterr().err
