"""``python -m klbisect`` and the ``klbisect`` console script. A Ctrl-C,
SIGTERM or SIGHUP at any moment is one line and exit 130 (and, with
``--json``, the failure object), not a Python traceback or a silent death:
while the modules load (numpy, click: about half a second) and from then
on, not only once a command opens its session."""
import signal
import sys


def _stop(signum, frame):
    raise KeyboardInterrupt


def _interrupted(said: str) -> None:
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)    # said and exiting 130: a second stop changes nothing
    print(f"klbisect: {said}", file=sys.stderr)
    if "--json" in sys.argv[1:]:
        import json
        from .errors import EXIT_INTERRUPTED, json_failure
        print(json.dumps(json_failure(sys.argv[1:2] == ["nightly"], said, EXIT_INTERRUPTED)), flush=True)
    sys.exit(130)


def _closed_to_devnull() -> None:
    """``klbisect probe >&-``: Python sets a closed stream to None, and the
    first line printed was an AttributeError and exit 120, which git bisect
    records as bad. What nobody can read goes to /dev/null (also for the
    probes, which would otherwise get fd 1 as their first open file)."""
    import os
    for fd, name in ((1, "stdout"), (2, "stderr")):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_WRONLY)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
            setattr(sys, name, open(fd, "w", buffering=1, closefd=False))


def run() -> None:
    # first thing: a stop in the next instants is one line and 130 too (a tester's Ctrl-C
    # 30 ms into `klbisect probe` was a traceback, and before this function, exit 1: "bad")
    early = (signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.getsignal(s) for s in early}
    try:
        for s in early:
            if old[s] is not signal.SIG_IGN:   # nohup's SIGHUP stays ignored
                signal.signal(s, _stop)
        _closed_to_devnull()
        from .redact import RedactingStream
        # every line any command prints, tokens out (a probe command's HF_TOKEN=..., an --api-key)
        sys.stdout, sys.stderr = RedactingStream(sys.stdout), RedactingStream(sys.stderr)
        from .cli import main
        from .proc import interrupt_on_stop_signals, settle
    except KeyboardInterrupt:
        _interrupted("interrupted before it started; nothing was recorded")
    except Exception as e:  # noqa: BLE001 - a traceback's exit 1 is "bad" to git bisect
        # a --build that pip-installs into this interpreter can break numpy or click between
        # two probes: exit 1 would record the commit as bad
        from .errors import EXIT_INTERNAL, json_failure, shown   # errors imports nothing that can break
        said = (f"klbisect cannot load its own modules in {sys.executable} ("
                f"{shown(f'{type(e).__name__}: {e}', one_line=True)}); "
                "a build or install step may have changed this environment: reinstall klbisect's "
                "dependencies there, or give the build its own environment")
        print(f"klbisect: error: {said}", file=sys.stderr)
        if "--json" in sys.argv[1:]:
            import json
            print(json.dumps(json_failure(sys.argv[1:2] == ["nightly"], said, EXIT_INTERNAL)), flush=True)
        sys.exit(EXIT_INTERNAL)
    try:
        # installed before the early handlers go: no moment is left with SIGTERM's default
        with interrupt_on_stop_signals():
            try:
                main()
            except SystemExit:
                settle()
                raise
    except KeyboardInterrupt:   # in the instants main() does not cover (its own catch reports the rest)
        _interrupted("interrupted; finished runs are saved, rerun to resume")
    finally:
        for s, h in old.items():
            if signal.getsignal(s) is not signal.SIG_IGN:   # settled: ignored until the process ends
                signal.signal(s, signal.SIG_DFL if h is None else h)

if __name__ == "__main__":
    run()
