"""``python -m klbisect`` and the ``klbisect`` console script. A Ctrl-C
while the modules load (numpy, click: about half a second) is one line and
exit 130, like one later on, not a Python traceback."""
import sys


def run() -> None:
    try:
        from .cli import main
    except KeyboardInterrupt:
        print("klbisect: interrupted before it started; nothing was recorded", file=sys.stderr)
        sys.exit(130)
    main()


if __name__ == "__main__":
    run()
