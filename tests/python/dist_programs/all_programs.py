"""The end-to-end programs one after another in one job (one process group, one torchrun
start: the multi-machine test pays torch's start-up once): ddp_train, moe_layer, pipeline,
each with its own checks; rank 0 prints each program's line as the program alone does.

    torchrun --nproc_per_node 4 all_programs.py --backend epx [--only ddp_train,pipeline]
"""
import ddp_train
import moe_layer
import pipeline
from _common import Checks, finish_all, setup

PROGRAMS = {"ddp_train": ddp_train, "moe_layer": moe_layer, "pipeline": pipeline}


def options(ap):
    ddp_train.options(ap)
    moe_layer.options(ap)
    ap.add_argument("--only", default=",".join(PROGRAMS), help="which programs, comma-separated, in this order")


def main():
    a = setup("all_programs", __doc__.split("\n\n")[0], options)
    results = []
    for name in a.only.split(","):
        c = Checks(name, a.rank)
        results.append((c, PROGRAMS[name].run(a, c)))
    finish_all(results)


if __name__ == "__main__":
    main()
