"""`tempax launch --nproc N [--devices-per-process D] -- COMMAND ...`: start N processes of one multi-process run on
this machine. The launcher (the processes' coordinator settings, stopping the rest when one fails) is
`tempax.parallel.launch`; this module parses arguments.
"""

from __future__ import annotations

import argparse

from tempax.parallel.launch import launch

# Ctrl-C stops the processes it started, waiting for them (`tempax.cli.interrupt`).
HANDLES_CTRL_C = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (
        "example: tempax launch --nproc 2 --devices-per-process 2 -- tempax sft --config recipes/sft_full_tiny.yaml "
        "train.mesh.fsdp=4\n\nEach process gets JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID and "
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo.\nOn SLURM / Open MPI / Kubernetes / Cloud TPU start one process "
        "per host with the cluster's tool and set train.mesh.cluster=true instead."
    )
    parser.add_argument("--nproc", type=int, required=True, help="number of processes to start on this machine")
    parser.add_argument("--devices-per-process", type=int, default=None, metavar="D",
                        help="CPU only: XLA host devices per process (--xla_force_host_platform_device_count)")
    parser.add_argument("--port", type=int, default=None, help="coordinator port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--timeout", type=float, default=None, metavar="S",
                        help="stop every process after S seconds (exit status 124)")
    parser.add_argument("--grace", type=float, default=10.0, metavar="S",
                        help="seconds between SIGTERM and SIGKILL when stopping the processes")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the command each process runs")


def run(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    return launch(command, nproc=args.nproc, devices_per_process=args.devices_per_process, port=args.port,
                  timeout=args.timeout, grace=args.grace)
