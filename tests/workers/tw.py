"""A standard-library test worker (argv carries ttmesh-test-worker so leaks can be found).

Usage: python tw.py ttmesh-test-worker ACTION [ACTION ...]
  pids=DIR          write this process's pid to DIR/rank<R>.pid (R = $RANK)
  env=DIR           dump the environment to DIR/rank<R>.json
  child=DIR         start a grandchild (same group) that sleeps; its pid -> DIR/rank<R>.child
  setsid=DIR        start a grandchild in its own session; pid -> DIR/rank<R>.setsid
  ignore-term       ignore a stop: SIGTERM, and SIGINT, SIGHUP, SIGQUIT (ttmesh passes on the
                    user's own stop signal, as torchrun does)
  on-term=CODE      exit CODE on a stop (SIGTERM, SIGINT, SIGHUP, SIGQUIT), after writing the
                    signal's name to DIR/rank<R>.term if pids= was given
  usr1=DIR          on SIGUSR1 write DIR/rank<R>.usr1
  lines=N           print N long lines, each written in several pieces
  say=TEXT          print "TEXT from rank R" on stdout
  await=PATH        wait until PATH exists (exit 1 after 60 s without it)
  fail-rank=R:CODE  rank R exits CODE right away (after the other actions)
  fail-after=R:S:CODE  rank R exits CODE after S seconds
  ready             create $TTMESH_READY_FILE
  fabric            create $TTMESH_FABRIC_FILE
  exit=CODE         exit CODE after the actions (default: sleep until signalled)
  sleep=S           sleep S seconds, then exit 0
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

TAG = "ttmesh-test-worker"
rank = os.environ.get("RANK", "x")
pid_dir = None
term_code = None


def write(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _default_stops():
    # A grandchild takes the stop signals' defaults, whatever handlers this worker was given
    # (an ignored signal would be inherited across exec).
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)


def sleeper(new_session):
    return subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile True: time.sleep(60)", TAG, "grandchild"],
        preexec_fn=_default_stops,
        start_new_session=new_session,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def on_term(sig, _frame):
    if pid_dir:
        write(os.path.join(pid_dir, f"rank{rank}.term"), signal.Signals(sig).name)
    os._exit(term_code)


def main(args):
    global pid_dir, term_code
    final = None
    # Signal handlers first, whatever the order given: a test that sends a signal once it sees
    # pids= (or another file) would otherwise race the handler's installation.
    handlers = ("ignore-term", "on-term", "usr1")
    args = sorted(args, key=lambda a: a.partition("=")[0] not in handlers)
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "pids":
            pid_dir = value
            write(os.path.join(value, f"rank{rank}.pid"), str(os.getpid()))
        elif key == "env":
            write(os.path.join(value, f"rank{rank}.json"), json.dumps(dict(os.environ)))
        elif key == "child":
            write(os.path.join(value, f"rank{rank}.child"), str(sleeper(False).pid))
        elif key == "setsid":
            write(os.path.join(value, f"rank{rank}.setsid"), str(sleeper(True).pid))
        elif key == "ignore-term":
            for sig in STOPS:
                signal.signal(sig, signal.SIG_IGN)
        elif key == "on-term":
            term_code = int(value)
            for sig in STOPS:
                signal.signal(sig, on_term)
        elif key == "usr1":
            usr1_path = os.path.join(value, f"rank{rank}.usr1")
            signal.signal(signal.SIGUSR1, lambda *_, p=usr1_path: write(p, "1"))
        elif key == "lines":
            for i in range(int(value)):
                text = f"rank{rank}-line{i}-" + "x" * 300 + "\n"
                for j in range(0, len(text), 97):
                    os.write(1, text[j : j + 97].encode())
        elif key == "say":
            print(f"{value} from rank {rank}", flush=True)
        elif key == "await":
            deadline = time.monotonic() + 60
            while not os.path.exists(value):
                if time.monotonic() > deadline:
                    sys.exit(1)
                time.sleep(0.01)
        elif key == "ready":
            open(os.environ["TTMESH_READY_FILE"], "a").close()
        elif key == "fabric":
            open(os.environ["TTMESH_FABRIC_FILE"], "a").close()
        elif key == "fail-rank":
            r, code = value.split(":")
            if r == rank:
                sys.stderr.write(f"rank {rank} failing on purpose\n")
                sys.stderr.flush()
                os._exit(int(code))
        elif key == "fail-after":
            r, seconds, code = value.split(":")
            if r == rank:
                time.sleep(float(seconds))
                sys.stderr.write(f"rank {rank} failing on purpose\n")
                sys.stderr.flush()
                os._exit(int(code))
        elif key == "exit":
            final = int(value)
        elif key == "sleep":
            time.sleep(float(value))
            final = 0
    sys.stdout.flush()
    if final is not None:
        sys.exit(final)
    wait_for_signals()


def wait_for_signals():
    """Wait until a signal's handler ends this process, with no window for one to be lost.

    Python runs a handler between bytecodes: a signal that arrives after the last check and
    before a blocking sleep starts is handled only when the sleep ends (CI, a stop waited 60 s
    of time.sleep). The wakeup fd gets the signal's byte even then, so select returns at once
    and the handler runs."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    while True:
        select.select([r], [], [])
        os.read(r, 512)


if __name__ == "__main__":
    assert sys.argv[1] == TAG, "first argument must be the tag"
    main(sys.argv[2:])
