"""python3 -m epx.distributed [ranks]: a quick comparison of a few calls with gloo (not a test)."""
import sys

from epx.distributed._quickbench import _bench_main  # by its module name: the spawned ranks import it so

_bench_main(int(sys.argv[1]) if len(sys.argv) > 1 else 8)
