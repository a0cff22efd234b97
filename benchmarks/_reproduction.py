# Copyright 2026 The iterative-GRPO trl authors. Licensed under the Apache License, Version 2.0.
"""What the reproduction scripts (`reproduce_cold_start.py`, `reproduce_reward_model.py`, `reproduce_real_model.py`)
share: quiet transformers in their worker processes, running the jobs in worker processes, how a run's curve is
reduced to one number and seeds to mean ± std, and how the results and a finished figure are written."""

import concurrent.futures
import json
import math
import os
import statistics

from transformers.utils import logging as hf_logging


def quiet_transformers() -> None:
    """Errors only, no progress bars (many short runs would flood the terminal)."""
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def run_jobs(run_one, jobs: list[tuple], args, report) -> list[dict]:
    """`run_one(*job, args)` for every job: in this process when `args.workers == 1` (which also lets a test load a
    script as a module), else `args.workers` at a time in worker processes. `report(run, done, total)` is called as
    each run finishes. Returns the runs in the order they finished."""
    runs = []
    if args.workers == 1:
        finished = (run_one(*job, args) for job in jobs)
        pool = None
    else:
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=args.workers)
        futures = [pool.submit(run_one, *job, args) for job in jobs]
        finished = (future.result() for future in concurrent.futures.as_completed(futures))
    for run in finished:
        runs.append(run)
        report(run, len(runs), len(jobs))
    if pool is not None:
        pool.shutdown()
    return runs


def write_results(results: dict, output_dir: str) -> str:
    """Write `results` to `<output_dir>/results.json`, say where, and return the path."""
    path = os.path.join(output_dir, "results.json")
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    print(f"raw results: {path}")
    return path


def tail_mean(values: list[float], fraction: float) -> float:
    """The mean of the last `fraction` of `values` (at least one value)."""
    n = max(1, math.ceil(len(values) * fraction))
    return sum(values[-n:]) / n


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0.0 for a single value)."""
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def save_figure(fig, path: str, title: str, dpi: int) -> None:
    """Title `fig`, lay it out, write it to `path` (creating its folder) and close it."""
    import matplotlib.pyplot as plt  # optional: only the plots need it

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
