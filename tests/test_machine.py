"""How busy the machine was while something was timed."""

import subprocess
import sys
import time

from batchinfer.machine import Load, LoadWindow, process_age


def test_a_window_sees_the_cpu_another_process_takes():
    window = LoadWindow()
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"])
    spin.wait()
    load = window.stop()
    assert load is not None and load.others >= 0.5  # the spinning child: about one core for its 1.5 s
    quiet = LoadWindow()
    time.sleep(0.2)
    own = quiet.stop()
    assert own is not None and own.seconds >= 0.2


def test_load_says_what_took_the_machine_and_round_trips_the_report():
    load = Load(10.0, others=1.3, steal=0.2, cores=2, load_avg=3.1)
    assert load.busy() and load.slowdown() == 4.0  # 2 cores, 0.5 left to the job
    assert load.describe() == (
        "other processes used 1.3 of 2 cores and the hypervisor stole 0.2 of 2 cores (load average 3.1)"
    )
    again = Load.from_dict(load.as_dict())
    assert (again.others, again.steal, again.cores) == (1.3, 0.2, 2) and Load.from_dict("junk") is None
    assert not Load(1.0, 0.1, 0.0, 8, 0.4).busy()


def test_process_age_counts_from_batchinfer_not_from_a_shell_that_exec_ed_it():
    """`pip install ... && batchinfer run` may run batchinfer in the shell's own process (exec): its age then
    starts before the install. Here the shell sleeps 3 s, then becomes Python, which imports batchinfer."""
    assert 0 < process_age() < 24 * 3600
    script = "from batchinfer.machine import process_age; print(process_age())"
    shell = f"sleep 3; exec {sys.executable} -c '{script}'"
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60)
    assert float(done.stdout) < 2.0, done.stdout + done.stderr
