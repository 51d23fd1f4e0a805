"""The learner's limits that scale with where it runs: torch threads capped by the cgroup's CPU quota (read from
stand-in cgroup files), and the setup/save/resume timeout grown with the model's size."""

from __future__ import annotations

from pathlib import Path

from open_instruct.learner.deepspeed_setup import (
    LEARNER_TIMEOUT_FLOOR_S,
    cgroup_cpu_limit,
    folder_bytes,
    learner_timeout_s,
)
from open_instruct.learner.group import estimated_parameters, model_bytes


def cgroup(tmp_path: Path, membership: str, files: dict[str, str]) -> tuple[str, str]:
    """A stand-in /sys/fs/cgroup with `files` (relative paths) and a /proc/self/cgroup of `membership`."""
    root = tmp_path / "cgroup"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text + "\n")
    (tmp_path / "self_cgroup").write_text(membership)
    return str(root), str(tmp_path / "self_cgroup")


def test_a_cgroup_v2_quota_caps_the_cores(tmp_path):
    root, membership = cgroup(tmp_path, "0::/kubepods/pod1\n", {"kubepods/pod1/cpu.max": "250000 100000"})
    assert cgroup_cpu_limit(root, membership) == 2.5


def test_the_tightest_quota_on_the_path_wins_and_max_means_none(tmp_path):
    files = {"cpu.max": "max 100000", "a/cpu.max": "400000 100000", "a/b/cpu.max": "max 100000"}
    root, membership = cgroup(tmp_path, "0::/a/b\n", files)
    assert cgroup_cpu_limit(root, membership) == 4.0
    root, membership = cgroup(tmp_path / "none", "0::/\n", {"cpu.max": "max 100000"})
    assert cgroup_cpu_limit(root, membership) is None


def test_a_cgroup_v1_cfs_quota_caps_the_cores_and_minus_one_is_none(tmp_path):
    membership = "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n0::/\n"
    files = {"cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000", "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000"}
    root, path = cgroup(tmp_path, membership, files)
    assert cgroup_cpu_limit(root, path) == 3.0
    files = {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}
    root, path = cgroup(tmp_path / "unlimited", "1:cpu:/\n", files)
    assert cgroup_cpu_limit(root, path) is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cgroup_cpu_limit(str(tmp_path / "absent"), str(tmp_path / "absent_self")) is None


def test_the_learner_timeout_grows_with_the_model(tmp_path, model_path):
    assert learner_timeout_s(0) == LEARNER_TIMEOUT_FLOOR_S
    # 70B in bf16 (130 GiB) gets over an hour more than a small model's floor.
    assert learner_timeout_s(130 * 2**30) - LEARNER_TIMEOUT_FLOOR_S > 3600
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"\0" * 1000)
    (folder / "model-00002-of-00002.safetensors").write_bytes(b"\0" * 24)
    assert model_bytes(str(folder)) == 1024
    embedded = model_bytes(model_path)
    assert embedded == sum(f.stat().st_size for f in Path(model_path).glob("*.safetensors")) > 0


def test_a_model_not_on_disk_is_sized_from_its_config(model_path):
    """Where no weight files are there yet, the config's parameter count stands in (the embedded model: fp32)."""
    estimated, stored = estimated_parameters(model_path), model_bytes(model_path) / 4
    assert 0.9 * stored < estimated < 1.1 * stored


def test_a_universal_conversion_gets_the_limit_of_its_checkpoints_size(tmp_path):
    """ds_to_universal reads and writes the whole checkpoint (fp32 weights and two moments: 12 bytes a
    parameter): a 70B model's ~780 GiB get far more than the fixed hour it once had."""
    state = tmp_path / "learner"
    state.mkdir()
    with open(state / "zero_pp_rank_0_mp_rank_00_optim_states.pt", "wb") as shard:
        shard.truncate(780 * 2**30)  # sparse: the size is what counts, nothing is written
    (state / "mp_rank_00_model_states.pt").write_bytes(b"x" * 1024)
    assert folder_bytes(state) == 780 * 2**30 + 1024
    assert learner_timeout_s(folder_bytes(state)) > 6 * 3600
