"""A training-loop-shaped program on the reference (hyper_multicore), as a user writes one: its
own module type, two modules sharing resources, one rebuilt each step; gloo on CPU, launched by
torchrun. It knows nothing of hmc (tests/python/test_reference.py runs it wrapped).

    torchrun --nproc_per_node 3 reference_program.py [--steps N] [--skip-close RANK]
             [--linger S] [--no-reference]

--skip-close RANK: that rank skips its close of the shared pair, then works on for --linger
seconds before it ends (the others wait in the reference's close). --no-reference: a plain
torch.distributed program that never imports the reference.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist


def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--skip-close", type=int, default=None)
    parser.add_argument("--linger", type=float, default=0.0)
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--reference", default=os.environ.get("REFERENCE_PATH", ""))
    return parser.parse_args()


def plain(rank):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, rank)
    print(f"rank {rank}: plain program gathered {out}", flush=True)


def main():
    args = parse()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.no_reference:
        plain(rank)
        dist.destroy_process_group()
        return 0
    if args.reference:
        sys.path.insert(0, args.reference)
    from hyper_multicore.modules import module as hm

    class Workspace:
        def __init__(self, nbytes):
            self.buffer = torch.empty(nbytes, dtype=torch.uint8)
            self.nbytes = nbytes

        def lifecycle_signature(self):
            return ("workspace", self.nbytes)

        def can_close(self):
            return True

        def close(self):
            self.buffer = None

    class Projection(hm.MulticoreModule):
        def __init__(self, features):
            super().__init__(resource_specification=("projection", features),
                             resource_compatibility_key=("projection", features),
                             resource_scope_key="model")
            self.weight = torch.nn.Parameter(torch.randn(features, features) * 0.01)

        def _create_execution_resources(self, tensor, *, shared, active_specifications):
            return Workspace(1024 * self.weight.shape[0])

        def forward(self, x):
            self._get_execution_resources(x)
            return x @ self.weight

    encoder, decoder = Projection(16), Projection(16)
    Projection.share_execution_resources([encoder, decoder])
    x = torch.randn(4, 16)
    for step in range(args.steps):
        head = Projection(8)  # rebuilt each step
        decoder(encoder(x))
        head(torch.randn(4, 8))
        head.close()
        print(f"rank {rank}: step {step} done", flush=True)
    if rank == args.skip_close:
        print(f"rank {rank}: skipping the close of the shared pair", flush=True)
        time.sleep(args.linger)
    else:
        encoder.close()
        decoder.close()
    print(f"rank {rank}: finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
