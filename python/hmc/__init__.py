"""hmc for Python programs on the reference (hyper_multicore), unmodified.

    torchrun --nproc_per_node 4 -m hmc train.py ARGS     # wrap a program, as python3 -m cProfile
    srun python3 -m hmc train.py ARGS

or, as one line in the program:

    import hmc.reference
    hmc.reference.attach()

Every exchange of the reference is tagged with its stage and sequence, and each rank's
heartbeat goes to the job's own store under hmc's keys, so that `hmc-run status --master-addr
A --master-port P` attaches to the running job; at the deadline (HMC_TIMEOUT) a waiting rank
prints who waits where and who never came (docs/python.md).
"""

__version__ = "0.1.0"
