"""One multirun command through each launcher that can run here: joblib with two worker processes
(one fake GPU each), submitit_local, SLURM through a stand-in for sbatch/srun/sacct, and Ray when
hydra-ray-launcher is installed. Every run must finish and the sweep summary must say so."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from base.run.sweep import read_summary

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["stage=describe", "seed=0,1,2"]  # the same sweep for every launcher: three runs


def multirun(tmp_path: Path, *args: str, env: dict[str, str] | None = None, timeout: int = 300):
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", f"outputs_dir={tmp_path}", f"artifacts_dir={tmp_path}/art",
           "logger=none", "model=tiny_qwen3", "task=smoke", *args]
    proc = subprocess.run(cmd, check=False, cwd=tmp_path, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def reports(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in sweep_dir.glob("*/report.json")}


def check_all_finished(tmp_path: Path, launcher: str) -> tuple[dict[str, dict], list[dict]]:
    sweep_dir = tmp_path / "default"
    reps = reports(sweep_dir)
    assert sorted(r["seed"] for r in reps.values()) == [0, 1, 2]
    rows = read_summary(sweep_dir)
    assert sorted(r["run"] for r in rows) == sorted(reps)
    assert {r["status"] for r in rows} == {"finished"} and {r["launcher"] for r in rows} == {launcher}
    assert all(r["config_hash"] == reps[r["run"]]["config_hash"] for r in rows)
    return reps, rows


@pytest.mark.slow
def test_joblib_two_processes_one_gpu_each(tmp_path):
    pool = f"fakeA{os.getpid()},fakeB{os.getpid()}"  # names only: the CPU build never reads them
    proc = multirun(tmp_path, "hydra/launcher=local_gpus", *SWEEP, env={"CUDA_VISIBLE_DEVICES": pool})
    assert proc.returncode == 0
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr  # one worker per GPU of the pool
    reps, rows = check_all_finished(tmp_path, "JoblibLauncher")
    for r in rows:  # each run saw exactly the GPU it held
        assert reps[r["run"]]["host"]["cuda_visible_devices"] == r["gpu"] and r["gpu"] in pool.split(",")
    gpus_of: dict[str, set] = {}
    for r in rows:
        gpus_of.setdefault(r["pid"], set()).add(r["gpu"])
    assert len(gpus_of) >= 1 and all(len(g) == 1 for g in gpus_of.values())
    assert len({next(iter(g)) for g in gpus_of.values()}) == len(gpus_of)  # worker processes never share one
    assert os.getpid() not in {int(p) for p in gpus_of}


@pytest.mark.slow
def test_submitit_local(tmp_path):
    proc = multirun(tmp_path, "hydra/launcher=submitit_local", *SWEEP)
    assert proc.returncode == 0
    reps, _ = check_all_finished(tmp_path, "LocalLauncher")
    assert len({r["host"]["pid"] for r in reps.values()}) == 3  # a process per job
    assert list((tmp_path / "default" / ".submitit").iterdir())  # submitit's own job folders


FAKE_SBATCH = r"""#!/bin/bash
# stand-in for sbatch: runs every task of the array script in the background, with SLURM's variables
id=$((4000 + RANDOM % 1000))
script="$FAKE_SLURM/job$id.sbatch"  # submitit renames its file once sbatch returns
cp "$1" "$script"; cp "$1" "$FAKE_SLURM/last.sbatch"
arr=$(grep -o -- '--array=[0-9-]*' "$script" | cut -d= -f2)
for t in $(seq "${arr%-*}" "${arr#*-}"); do
  SLURM_JOB_ID=$id SLURM_ARRAY_JOB_ID=$id SLURM_ARRAY_TASK_ID=$t SLURM_NTASKS=1 SLURM_JOB_NUM_NODES=1 \
  SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_JOB_NODELIST=localhost \
    setsid bash "$script" > "$FAKE_SLURM/task$t.log" 2>&1 &
done
echo "Submitted batch job $id"
"""
FAKE_SRUN = r"""#!/bin/bash
# stand-in for srun: drops its options, runs the command
while [[ "$1" == -* ]]; do case "$1" in --output|--error) shift 2;; *) shift;; esac; done
exec "$@"
"""
FAKE_SACCT = """#!/bin/bash
echo "JobID|State|NodeList"
"""


@pytest.mark.slow
def test_slurm_config_through_stand_in_commands(tmp_path):
    """hydra/launcher=slurm with the partition and account from the environment: the sbatch script
    submitit writes carries them, and the array's tasks run the sweep."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sbatch", FAKE_SBATCH), ("srun", FAKE_SRUN), ("sacct", FAKE_SACCT), ("scancel", "#!/bin/bash\n")):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SLURM": str(tmp_path), "SBATCH_PARTITION": "h200",
           "SBATCH_ACCOUNT": "moe-lab", "BASE_SLURM_TIME_MIN": "30", "BASE_SLURM_GPUS": "2"}
    proc = multirun(tmp_path, "hydra/launcher=slurm", "hydra.launcher.mem_gb=100", *SWEEP, env=env)
    assert proc.returncode == 0
    script = (tmp_path / "last.sbatch").read_text()
    for line in ("--partition=h200", "--account=moe-lab", "--time=30", "--gpus-per-node=2", "--mem=100GB",
                 "--cpus-per-task=8", "--array=0-2%3"):
        assert f"#SBATCH {line}\n" in script, line
    assert "export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1\n" in script  # nodes without the hub
    reps, _ = check_all_finished(tmp_path, "SlurmLauncher")
    assert {r["host"]["slurm_job_id"] for r in reps.values()} != {None}


@pytest.mark.slow
def test_ray_local_instance(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_ray_launcher")
    proc = multirun(tmp_path, "hydra/launcher=ray_jobs", *SWEEP, timeout=600)
    assert proc.returncode == 0
    check_all_finished(tmp_path, "RayLauncher")


def test_a_bad_launcher_setting_in_the_environment_fails_at_start(tmp_path):
    proc = multirun(tmp_path, "hydra/launcher=slurm", *SWEEP, env={"BASE_SLURM_TIME_MIN": "0"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: BASE_SLURM_TIME_MIN='0' must be a whole number >= 1 (read by hydra/launcher=slurm)"
    assert not (tmp_path / "default").exists()
