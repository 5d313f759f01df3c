import pytest

from ps.config import VARIABLES, Config
from ps.errors import ConfigError

BASE = {"DMLC_PS_ROOT_URI": "127.0.0.1", "DMLC_PS_ROOT_PORT": "9000",
        "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "3"}


def test_defaults_and_required():
    cfg = Config.from_env(BASE)
    assert (cfg.role, cfg.num_servers, cfg.num_workers, cfg.root_port) == ("worker", 2, 3, 9000)
    assert cfg.heartbeat_interval == 1.0 and cfg.heartbeat_timeout == 30.0
    assert cfg.bigarray_bound == 1_000_000 and cfg.connect_timeout == 120.0
    assert cfg.resend is False and cfg.resend_timeout == 1000


@pytest.mark.parametrize("missing", ["DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER"])
def test_missing_required_names_variable(missing):
    env = {k: v for k, v in BASE.items() if k != missing}
    with pytest.raises(ConfigError, match=missing):
        Config.from_env(env)


@pytest.mark.parametrize("var,value", [("DMLC_NUM_SERVER", "two"), ("DMLC_NUM_WORKER", "0"),
                                       ("DMLC_PS_ROOT_PORT", "70000"), ("DMLC_ROLE", "Server"),
                                       ("PS_RESEND", "maybe"), ("PS_PORT_RANGE", "9100"),
                                       ("PS_HEARTBEAT_TIMEOUT", "-1"), ("PS_DROP_MSG", "150"),
                                       ("MXNET_KVSTORE_BIGARRAY_BOUND", "1e6")])
def test_bad_value_names_variable_and_value(var, value):
    with pytest.raises(ConfigError) as err:
        Config.from_env({**BASE, var: value})
    assert var in str(err.value) or var == "PS_DROP_MSG"
    assert value in str(err.value) or "150" in str(err.value)


def test_port_aliases_and_range():
    assert Config.from_env({**BASE, "DMLC_PORT": "7001"}).port == 7001
    assert Config.from_env({**BASE, "DMLC_PORT": "7001", "PORT": "7002"}).port == 7002
    assert Config.from_env({**BASE, "PS_PORT_RANGE": "9100-9200"}).port_range == (9100, 9200)


def test_port_zero_only_for_scheduler():
    with pytest.raises(ConfigError, match="DMLC_PS_ROOT_PORT"):
        Config.from_env({**BASE, "DMLC_PS_ROOT_PORT": "0"})
    assert Config.from_env({**BASE, "DMLC_PS_ROOT_PORT": "0", "DMLC_ROLE": "scheduler"}).root_port == 0


def test_heartbeat_timeout_must_exceed_interval():
    with pytest.raises(ConfigError, match="PS_HEARTBEAT_TIMEOUT"):
        Config.from_env({**BASE, "PS_HEARTBEAT_INTERVAL": "5", "PS_HEARTBEAT_TIMEOUT": "6"})


def test_every_variable_maps_to_a_field():
    fields = set(Config.__dataclass_fields__)
    assert {v.field for v in VARIABLES} <= fields


def test_manager_rank_reads_mpirun_and_srun_variables():
    from ps.config import manager_rank
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_MCA_ess_base_jobid": "77"}
    assert manager_rank(ompi) == ("Open MPI", 2, 4, 0, 2, True, "77", None)
    mpich = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_KVSNAME": "kvs_9"}
    assert manager_rank(mpich) == ("MPICH", 1, 2, 1, 2, False, "kvs_9", None)
    srun = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_NODES": "2",
            "SLURM_JOB_ID": "12", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]", "SLURM_NTASKS": "4"}
    assert manager_rank(srun) == ("Slurm", 3, 4, 1, 2, True, "12.0", "n[1-2]")
    batch_shell = {k: v for k, v in srun.items() if k != "SLURM_STEP_ID"}      # sbatch's own shell: no rank
    assert manager_rank(batch_shell) is None and manager_rank({}) is None
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_SIZE must be >= 1"):
        manager_rank({**ompi, "OMPI_COMM_WORLD_SIZE": "0"})


@pytest.mark.parametrize("raw, host, port", [("8787", "127.0.0.1", 8787), ("0.0.0.0:80", "0.0.0.0", 80),
                                             ("[::1]:9000", "::1", 9000), ("host.example:0", "host.example", 0)])
def test_dashboard_address_defaults_to_this_machine(raw, host, port):
    listen = Config.from_env({**BASE, "PS_DASHBOARD": raw}).dashboard
    assert (listen.host, listen.port) == (host, port)
    assert Config.from_env(BASE).dashboard is None


@pytest.mark.parametrize("raw", ["x", "host:", ":80", "70000", "h:-1"])
def test_a_bad_dashboard_address_names_the_value(raw):
    with pytest.raises(ConfigError, match=rf"PS_DASHBOARD must be \[HOST:\]PORT.*{raw!r}"):
        Config.from_env({**BASE, "PS_DASHBOARD": raw})


def test_a_joint_process_counts_one_server_per_worker():
    """DMLC_ROLE=joint: a worker holding a server shard (MXNet's dist_sync_mpi, BytePS's joint)."""
    env = {k: v for k, v in BASE.items() if k != "DMLC_NUM_SERVER"}
    cfg = Config.from_env({**env, "DMLC_ROLE": "joint", "DMLC_NUM_WORKER": "3"})
    assert (cfg.is_joint, cfg.is_worker, cfg.num_servers, cfg.num_workers) == (True, False, 3, 3)
    with pytest.raises(ConfigError, match=r"DMLC_ROLE=joint: .* DMLC_NUM_SERVER \(2\) must equal DMLC_NUM_WORKER \(3\)"):
        Config.from_env({**env, "DMLC_ROLE": "joint", "DMLC_NUM_WORKER": "3", "DMLC_NUM_SERVER": "2"})
    with pytest.raises(ConfigError, match="DMLC_NUM_SERVER is not set"):      # only joint derives it
        Config.from_env({**env, "DMLC_NUM_WORKER": "3"})


def test_chunk_bytes_defaults_to_a_mebibyte_takes_sizes_in_whole_words_and_refuses_what_is_under_96k():
    assert Config.from_env(BASE).chunk_bytes == 1 << 20
    assert Config.from_env({**BASE, "PS_CHUNK_BYTES": "256K"}).chunk_bytes == 256 << 10
    assert Config.from_env({**BASE, "PS_CHUNK_BYTES": "104858"}).chunk_bytes == 104856   # whole 8-byte words
    with pytest.raises(ConfigError, match=r"PS_CHUNK_BYTES must be at least 96K \(98304\), got '64K'"):
        Config.from_env({**BASE, "PS_CHUNK_BYTES": "64K"})


def test_the_least_chunk_is_one_the_send_window_counts():
    from ps.config import CHUNK_MIN
    from ps.sendqueue import CREDIT_MIN
    assert CHUNK_MIN > CREDIT_MIN           # a one-chunk message must be credited (PS_SEND_WINDOW)


@pytest.mark.parametrize("extra, keep", [
    ({}, 16 << 20),
    ({"PS_SERVER_MALLOC_KEEP": "16M"}, 16 << 20),
    ({"PS_SERVER_MALLOC_KEEP": "0"}, 0),
    ({"MALLOC_TRIM_THRESHOLD_": "1000000"}, 0),                       # the user's own malloc setting wins
    ({"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1000000"}, 0),
    ({"GLIBC_TUNABLES": "glibc.pthread.rseq=0"}, 16 << 20),            # a tunable of something else
])
def test_a_servers_malloc_keeps_freed_memory_unless_the_user_tuned_malloc(extra, keep):
    assert Config.from_env({**BASE, "DMLC_ROLE": "server", **extra}).server_malloc_keep == keep
