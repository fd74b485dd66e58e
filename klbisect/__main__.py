"""``python -m klbisect`` and the ``klbisect`` console script. A Ctrl-C,
SIGTERM or SIGHUP while the modules load (numpy, click: about half a
second) is one line and exit 130, like one later on, not a Python
traceback or a silent death."""
import signal
import sys


def _stop(signum, frame):
    raise KeyboardInterrupt


def run() -> None:
    early = (signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.getsignal(s) for s in early}
    try:
        for s in early:
            if old[s] is not signal.SIG_IGN:   # nohup's SIGHUP stays ignored
                signal.signal(s, _stop)
        from .cli import main
    except KeyboardInterrupt:
        print("klbisect: interrupted before it started; nothing was recorded", file=sys.stderr)
        sys.exit(130)
    finally:
        for s, h in old.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)
    main()


if __name__ == "__main__":
    run()
