"""Chaos test of checkpoint resume: kill a training job at a random moment, resume `last`, compare with a clean run.

For a launch (`single`: 1 process; `ddp`: 2-process DDP under torchrun; `zero2`/`zero3`: 2-process DeepSpeed on CPU
from the shipped accelerate configs), each trial runs tests/helpers/mp_train.py's job as CE-GPPO is meant to run,
off-policy: `steps_per_generation` = 4 x `gradient_accumulation_steps` (4 optimizer steps per rollout batch, and
`save_steps=4` saves at steps 4, 8, 12: rollout-batch ends), with a callback that writes into every checkpoint in
`on_save` (as an EMA or README callback does). The job runs three epochs (12 steps: 8 prompts, 8 per rollout batch),
so kills land in epochs 1, 2 and 3. Each trial draws a variant: `save_total_limit` 2 or 1, `load_best_model_at_end`
or not (evaluating at every save), when to SIGKILL one random process of the job (a worker rank or the launcher):
`early` (at a random time after the run took its `output_dir` lock and before its first checkpoint is committed),
`time` (a random time after the first commit) or `save` (while a checkpoint is being written), and how it is
requeued: `last` (the same job with `resume_from_checkpoint="last"`, as a scheduler does, whatever the kill left) or
`outside` (the newest committed checkpoint copied out of `output_dir` and resumed by its path into a new
`output_dir`; `last` when there is none). The rest of the job is killed first, as a scheduler would (every process it
started, whatever session it is in: torchrun's workers have sessions of their own). A trial passes when the requeued
run finishes and its final parameters equal the uninterrupted run's of the same variant: bit-identical for one
process and DDP, within the ZeRO parity tolerance (tests/helpers/mp_launch.py) under DeepSpeed.

Usage: `python -m tests.helpers.chaos [--launch single ddp zero2 zero3] [--trials N] [--seed S] [--work DIR]` (or
`python tests/helpers/chaos.py ...`); prints one line per trial and a summary, exits 1 if any trial failed.
tests/test_chaos.py runs a short version (one trial of each variant that matters, 1 process and DDP).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.mp_launch import (  # noqa: E402
    ACCELERATE,
    LAYOUT_ATOL,
    TORCHRUN,
    ZERO2_ATOL,
    cpu_accelerate_config,
    free_port,
    start,
)

from cegppo_trl.checkpoints import COMMIT_FILE, LOCK_FILE, checkpoint_folders  # noqa: E402

LAUNCHES = ("single", "ddp", "zero2", "zero3")
KILLS = ("early", "time", "save")
RESUMES = ("last", "outside")
MAX_STEPS = 12
STEPS_PER_BATCH = 4
SPEC = {
    "loss_types": ["dapo"],
    "save_steps": STEPS_PER_BATCH,
    "max_steps": MAX_STEPS,
    "num_iterations": 1,
    "steps_per_generation": STEPS_PER_BATCH,  # x gradient_accumulation_steps (1)
    "dataset_repeats": 2,  # 8 prompts: one rollout batch, 4 steps, per epoch
    "on_save_writes": True,
    "pid_files": True,
}
TOLERANCE = {"single": 0.0, "ddp": 0.0, "zero2": ZERO2_ATOL, "zero3": LAYOUT_ATOL}


def variant_spec(variant: dict) -> dict:
    """The job's spec for a trial `variant` (`save_total_limit`, `load_best`)."""
    return {
        **SPEC,
        "save_total_limit": variant["save_total_limit"],
        "load_best_model_at_end": variant["load_best"],
    }


def draw_variant(rng: random.Random) -> dict:
    return {
        "save_total_limit": rng.choice((2, 1)),
        "load_best": rng.random() < 0.5,
        "kill": rng.choice(KILLS),
        "resume": rng.choice(RESUMES),
    }


def launcher(launch: str, work: Path) -> tuple[list[str], dict[str, str], dict]:
    """The launch prefix, its environment and the spec additions for `launch`."""
    if launch == "single":
        return [sys.executable], {"ACCELERATE_USE_CPU": "1"}, {}
    if launch == "ddp":
        return (
            [str(TORCHRUN), "--nproc_per_node", "2", "--master_port", str(free_port())],
            {"ACCELERATE_USE_CPU": "1"},
            {},
        )
    config = work / f"cpu_deepspeed_{launch}.yaml"
    if not config.exists():
        config = cpu_accelerate_config(f"deepspeed_{launch}.yaml", work)
    prefix = [str(ACCELERATE), "launch", "--config_file", str(config), "--main_process_port", str(free_port())]
    return prefix, {}, {"zero3": True} if launch == "zero3" else {}


def run_job(launch: str, out: Path, work: Path, resume: str | None = None, timeout: float = 300) -> subprocess.Popen:
    prefix, env, extra = launcher(launch, work)
    spec = {**SPEC, **extra, **({"resume": resume} if resume else {})}
    proc = start(prefix, out, spec, **env)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(proc, out)
    return proc


def job_processes(proc: subprocess.Popen, out: Path) -> list[psutil.Process]:
    """Every process of the job: the launcher, its descendants, and any process named in a pid file."""
    found = {}
    try:
        root = psutil.Process(proc.pid)
        for p in [root, *root.children(recursive=True)]:
            found[p.pid] = p
    except psutil.NoSuchProcess:
        pass
    for pid_file in out.glob("pid_*"):
        try:
            pid = int(pid_file.read_text())
            found.setdefault(pid, psutil.Process(pid))
        except (ValueError, psutil.NoSuchProcess, OSError):
            pass
    return list(found.values())


def kill_job(proc: subprocess.Popen, out: Path, processes: list[psutil.Process] | None = None) -> None:
    """SIGKILL every process of the job (recorded beforehand when given) and reap the launcher."""
    for p in processes if processes is not None else job_processes(proc, out):
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    for p in processes or []:
        try:
            p.wait(timeout=30)
        except (psutil.NoSuchProcess, psutil.TimeoutExpired, ChildProcessError):
            pass


def _committed(output_dir: Path) -> list[Path]:
    return [Path(f) for f in checkpoint_folders(str(output_dir)) if (Path(f) / COMMIT_FILE).exists()]


def _saving(output_dir: Path) -> bool:
    """A checkpoint folder newer than every committed one exists: a save is under way."""
    folders = checkpoint_folders(str(output_dir))
    return bool(folders) and not (Path(folders[-1]) / COMMIT_FILE).exists()


def _workers(proc: subprocess.Popen, out: Path, world: int) -> list[psutil.Process]:
    """The job's worker processes, rank order unknown (the launcher itself for one process)."""
    if world == 1:
        return [psutil.Process(proc.pid)]
    while True:
        found = [
            p for p in job_processes(proc, out) if p.pid != proc.pid and any("mp_train.py" in a for a in _cmdline(p))
        ]
        if len(found) >= world or proc.poll() is not None:
            return sorted(found, key=lambda p: p.pid)
        time.sleep(0.005)


def _wait_for_start(proc: subprocess.Popen, output_dir: Path, deadline: float) -> None:
    """Until the run has taken its `output_dir` lock (the file exists): the run has begun."""
    while time.monotonic() < deadline and proc.poll() is None and not (output_dir / LOCK_FILE).exists():
        time.sleep(0.002)


def _step(folder: str) -> int:
    return int(Path(folder).name.split("-")[1])


def trial(launch: str, out: Path, work: Path, rng: random.Random, timing: dict, variant: dict) -> dict:
    """One kill-and-requeue trial of `variant` in `out` (fresh); returns what happened."""
    world = 1 if launch == "single" else 2
    prefix, env, extra = launcher(launch, work)
    spec = {**variant_spec(variant), **extra}
    proc = start(prefix, out, spec, **env)
    output_dir = out / "dapo"
    mode = variant["kill"]
    deadline = time.monotonic() + 300
    workers = _workers(proc, out, world)
    processes = job_processes(proc, out)  # what the scheduler knows of the job, recorded before the kill
    victim = rng.choice(workers + ([psutil.Process(proc.pid)] if world > 1 else []))
    victim_name = "launcher" if victim.pid == proc.pid and world > 1 else f"worker {workers.index(victim)}"
    if mode == "early":  # once the run began in output_dir, before its first checkpoint (or as its save begins)
        _wait_for_start(proc, output_dir, deadline)
        until = time.monotonic() + rng.uniform(0, timing["first_commit"])
        while time.monotonic() < until and proc.poll() is None and not checkpoint_folders(str(output_dir)):
            time.sleep(0.002)
    else:
        while time.monotonic() < deadline and proc.poll() is None and not _committed(output_dir):
            time.sleep(0.005)
        if mode == "time":
            time.sleep(rng.uniform(0, timing["after_first_commit"]))
        else:  # while the save of a later rollout-batch end is being written
            wanted = rng.choice(range(2 * STEPS_PER_BATCH, MAX_STEPS + 1, STEPS_PER_BATCH))
            while proc.poll() is None and time.monotonic() < deadline:
                folders = checkpoint_folders(str(output_dir))
                if folders and _step(folders[-1]) >= wanted and (_saving(output_dir) or _step(folders[-1]) > wanted):
                    break
                time.sleep(0.0005)
            time.sleep(rng.uniform(0, 0.03))
    finished_first = proc.poll() is not None
    try:
        victim.send_signal(signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass
    time.sleep(rng.uniform(0, 0.2))  # the scheduler notices, then kills the rest of the job
    kill_job(proc, out, processes)

    committed = [p.name for p in _committed(output_dir)]
    folders = checkpoint_folders(str(output_dir))  # the newest, marked or not: the epoch the kill landed in, roughly
    result = {
        **variant,
        "victim": victim_name,
        "finished_before_kill": finished_first and proc.returncode == 0,
        "committed_after_kill": committed,
        "newest_folder_after_kill": Path(folders[-1]).name if folders else None,
    }
    if result["finished_before_kill"]:
        result["resumed"] = None
        result["params"] = str(out / "params_dapo.pt")
        return result
    for stale in out.glob("params_*.pt"):
        stale.unlink()
    resume, where = "last", out  # the scheduler's requeue: the same job
    if variant.get("resume") == "outside" and committed:  # a copy resumed by its path into a new `output_dir`
        resume = str(work / f"{out.name}-copies" / committed[-1])
        shutil.rmtree(Path(resume).parent, ignore_errors=True)
        shutil.copytree(output_dir / committed[-1], resume)
        where = out / "requeue"
    requeued = start(prefix, where, {**spec, "resume": resume}, **env)
    try:
        requeued.wait(timeout=300)
    except subprocess.TimeoutExpired:
        kill_job(requeued, where)
    result["resumed"] = (resume if resume != "last" else committed[-1]) if committed else "nothing (fresh start)"
    if requeued.returncode != 0:
        result["error"] = f"requeued run exited {requeued.returncode}: " + requeued.log_path.read_text()[-2000:]
        return result
    result["params"] = str(where / "params_dapo.pt")
    return result


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def compare(reference: dict, params_file: str, atol: float) -> float | None:
    """The largest parameter difference from `reference` (None when the file is missing)."""
    if not os.path.exists(params_file):
        return None
    params = torch.load(params_file)
    missing = sorted(set(reference) - set(params))
    if [name for name in missing if name != "lm_head.weight"]:  # a checkpoint's safetensors drop tied weights
        return None
    return max(
        (params[name].float() - value).abs().max().item() for name, value in reference.items() if name in params
    )


def reference_run(launch: str, work: Path, variant: dict) -> tuple[dict, dict]:
    """The uninterrupted job's final parameters for `variant`, and its times from the run's start (its lock file) to
    the first commit and from there to the end (where kills land)."""
    key = f"limit{variant['save_total_limit']}-best{int(variant['load_best'])}"
    out = work / f"{launch}-reference-{key}"
    shutil.rmtree(out, ignore_errors=True)
    prefix, env, extra = launcher(launch, work)
    proc = start(prefix, out, {**variant_spec(variant), **extra}, **env)
    _wait_for_start(proc, out / "dapo", time.monotonic() + 300)
    began = time.monotonic()
    while proc.poll() is None and not _committed(out / "dapo"):
        time.sleep(0.005)
    first_commit = time.monotonic()
    proc.wait(timeout=600)
    assert proc.returncode == 0, proc.log_path.read_text()[-3000:]
    timing = {"first_commit": first_commit - began, "after_first_commit": time.monotonic() - first_commit}
    return torch.load(out / "params_dapo.pt"), timing


def campaign(launches, trials: int, work: Path, seed: int = 0, log=print, variants=None) -> dict[str, list[dict]]:
    """Run `trials` trials of each launch in `work`, round-robin (so a campaign cut short has some of each); each
    trial draws its variant (`draw_variant`) unless `variants` lists them (cycled)."""
    work.mkdir(parents=True, exist_ok=True)
    rngs = {launch: random.Random(f"{launch}-{seed}") for launch in launches}
    references: dict[tuple, tuple[dict, dict]] = {}
    results: dict[str, list[dict]] = {launch: [] for launch in launches}
    for number in range(trials):
        for launch in launches:
            rng = rngs[launch]
            variant = dict(variants[number % len(variants)]) if variants else draw_variant(rng)
            key = (launch, variant["save_total_limit"], variant["load_best"])
            if key not in references:
                references[key] = reference_run(launch, work, variant)
            reference, timing = references[key]
            out = work / f"{launch}-trial{number}"
            shutil.rmtree(out, ignore_errors=True)
            began = time.monotonic()
            result = trial(launch, out, work, rng, timing, variant)
            if "error" not in result:
                worst = compare(reference, result["params"], TOLERANCE[launch])
                result["max_abs_diff"] = worst
                if worst is None or worst > TOLERANCE[launch]:
                    result["error"] = f"final parameters differ from the uninterrupted run's by {worst}"
            result["seconds"] = round(time.monotonic() - began, 1)
            results[launch].append(result)
            verdict = "PASS" if "error" not in result else "FAIL"
            log(f"{launch} trial {number}: {verdict} {json.dumps(result)[:700]}")
            if "error" not in result:
                shutil.rmtree(out, ignore_errors=True)
    return results


def summary(results: dict[str, list[dict]]) -> dict[str, str]:
    """Per launch: trials passed / run, how they were killed, and how many were requeued from a checkpoint."""
    lines = {}
    for launch, runs in results.items():
        passed = sum("error" not in r for r in runs)
        killed = sum(not r["finished_before_kill"] for r in runs)
        fresh = sum(r.get("resumed") == "nothing (fresh start)" for r in runs)
        kinds = ", ".join(f"{sum(r['kill'] == k for r in runs)} {k}" for k in KILLS)
        variants = (
            f"{sum(r['save_total_limit'] == 1 for r in runs)} with save_total_limit=1, "
            f"{sum(r['load_best'] for r in runs)} with load_best_model_at_end, "
            f"{sum(r['save_total_limit'] == 1 and r['load_best'] for r in runs)} with both, "
            f"{sum(r.get('resume') == 'outside' for r in runs)} resumed from outside output_dir"
        )
        lines[launch] = (
            f"{passed}/{len(runs)} passed; {killed} killed mid-run ({kinds}), {fresh} requeued before any "
            f"checkpoint; {variants}"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launch", nargs="+", choices=LAUNCHES, default=list(LAUNCHES))
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="cegppo-chaos-"))
    results = campaign(args.launch, args.trials, work, args.seed, log=lambda m: print(m, flush=True))
    print(json.dumps(summary(results)), flush=True)
    return 0 if all("error" not in r for runs in results.values() for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
