"""benchmarks/suite_time.py counts the CPU of processes that outlive their parent (a fork server outliving its
launcher), which /usr/bin/time misses."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORPHAN = ("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5:\n    pass\n")
PARENT = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {ORPHAN!r}])"   # exits at once


def test_the_cpu_of_an_orphan_is_counted():
    # in a child process: a subreaper pytest worker would keep every orphan of the other tests
    code = (f"import json, sys; sys.path.insert(0, {os.path.join(ROOT, 'benchmarks')!r}); import suite_time; "
            f"print(json.dumps(suite_time.run([sys.executable, '-c', {PARENT!r}])))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    result = json.loads(p.stdout)
    assert result["exit_code"] == 0 and result["cpu_s"] >= 0.45, result       # the orphan's 0.5 s included
    plain = subprocess.run(["/usr/bin/time", "-f", "%U %S", sys.executable, "-c", PARENT], capture_output=True,
                           text=True, timeout=60) if os.path.exists("/usr/bin/time") else None
    if plain is not None:                                                       # what the meter is for
        assert sum(map(float, plain.stderr.split()[-2:])) < 0.45
