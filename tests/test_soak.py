"""``benchmarks/soak.py``'s bookkeeping: it reads this process tree's memory and tells flat from growing."""

import os
import subprocess
import sys
import time

from benchmarks import soak


def test_it_samples_this_process_and_the_processes_below_it():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in soak.descendants(os.getpid())
        sample = soak.sample(time.monotonic())
        assert sample.processes >= 2 and 0 < sample.rss_mb <= sample.peak_rss_mb and sample.tree_rss_mb > sample.rss_mb
    finally:
        child.kill()
        child.wait()


def test_the_verdict_tells_a_flat_run_from_a_leak():

    def run(growth_mb_per_minute):  # one sample a minute for 30 minutes, RSS wobbling by 1 MB
        rss = [1000 + growth_mb_per_minute * m + (m % 2) for m in range(31)]
        return [
            soak.Sample(m, 100 * m, m // 5 + 1, m // 5 + 1, r, max(rss[: m + 1]), r + 50, 3) for m, r in enumerate(rss)
        ]

    flat = soak.verdict(run(0.0))
    assert flat[-1].startswith("verdict: flat") and "start (after the first validation" in flat[0]
    leaking = soak.verdict(run(2.0))  # 60 MB over half an hour
    assert leaking[-1].startswith("verdict: GROWING: RSS")
    assert any(line.startswith("RSS: slope +120.0 MB/h") for line in leaking)
    # The sample taken after fit returned is shown, not fitted: a jump there does not make a flat run grow.
    after = soak.Sample(31, 3100, 7, 7, 1500, 1500, 1550, 3)
    assert soak.verdict(run(0.0), after)[-1].startswith("verdict: flat")
    assert "(after fit)" in soak.report(run(0.0), after)
