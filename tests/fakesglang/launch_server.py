"""``python -m sglang.launch_server``: the fake server's entry point."""
import sys

from sglang.engine import serve

if __name__ == "__main__":
    serve(sys.argv[1:])
