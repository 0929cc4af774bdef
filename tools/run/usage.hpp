// tools/run/usage.hpp - the text of `cclite-run --help`.
//
// Prose, not logic: kept apart from the parser (options.hpp) so that the
// options' code and their documentation read on their own. What it says is
// also in tools/README.md; when an option changes, both change with it.
#pragma once

namespace cclite::run {

inline const char* usage_text() {
  return R"(usage: cclite-run [options] program [args...]

Starts --nproc-per-node copies of program on this node (one per device) with
the torchrun environment, relays their output line by line with a "[rank R]: "
prefix, and stops the whole job as soon as one worker fails.

options (--name value or --name=value; '_' may replace '-' as in torchrun):
  --nproc-per-node N   workers on this node (default 1); gpu: one per GPU this
                       process may use (CUDA_VISIBLE_DEVICES), cpu: one per CPU
                       it may run on, auto: gpu if there are GPUs, else cpu
  --nnodes M           nodes in the job (default 1); M > 1 needs --rdzv-endpoint
                       (under srun: the step's node count)
  --rdzv-endpoint H:P  where the nodes' agents meet (default port 29400): the
                       agent on host H hosts the store (else the first to bind
                       the port), node ranks are handed out in joining order
                       (H's node is 0) and node 0's address becomes
                       MASTER_ADDR; the same command runs on every node
  --rdzv-id ID         job id, the same on every node (default "none"); an
                       agent of another id at the same endpoint is refused
  --node-rank K        this node's index, 0..M-1 (optional: fixes the order)
  --rdzv-backend static
                       no agents' rendezvous: every node needs --node-rank,
                       and rank 0 hosts the store at --rdzv-endpoint itself
  --rdzv-timeout SEC   how long to wait for every node to join (default 900)
  --node-timeout SEC   a node whose agent is silent this long is declared lost
                       and the job stops on every node (default 15)
  --nnodes MIN:MAX     elastic: start with MAX nodes, or with at least MIN once
                       --rdzv-last-call SEC (default 30) passed without a newcomer;
                       a node that arrives later, while there are fewer than
                       MAX, is taken in: every node restarts its workers (not
                       counted by --max-restarts)
  --max-restarts K     after a failure (a worker, or a lost node) restart every
                       node's workers, up to K times: the agents meet again
                       (without the lost nodes, if MIN allows) and the workers
                       start over (they resume from their own checkpoints);
                       TORCHELASTIC_RESTART_COUNT tells them which attempt
  --master-addr A      MASTER_ADDR (default: endpoint host, else 127.0.0.1)
  --master-port P      MASTER_PORT (default: endpoint port, else a free port
                       on one node, 29500 on several)
  --standalone         one node, rendezvous on a free local port (this is
                       also what a plain --nproc-per-node N does)
  --tee-prefix         prefix worker output with "[rank R]: " (default)
  --no-prefix          pass worker output through unchanged (still whole lines)
  --timeout SEC        stop the job and exit 124 after SEC seconds
  --bind-to U          none (default, as torchrun), core or numa: each local worker
                       gets its own cores or NUMA nodes of this launcher's CPUs,
                       as mpirun --bind-to (more workers than units: they share)
  --log-dir DIR        where --redirects / --tee write: DIR/<rdzv-id>_XXXXXX/
                       attempt_<restart>/<local rank>/{stdout,stderr}.log (default:
                       a new directory in $TMPDIR)
  -r, --redirects N    a worker's streams into its log files instead of here: 0
                       none, 1 stdout, 2 stderr, 3 both; or per local rank: 0:1,1:2
  -t, --tee N          the same streams into the files and here as well
  --local-ranks-filter L
                       only these local ranks' output here (0 or 0,1); the
                       others' goes to their log files, as with --redirects 3
  --rdzv-conf K=V,...  torchrun's: join_timeout (= --rdzv-timeout),
                       last_call_timeout (= --rdzv-last-call), is_host (this
                       agent hosts the agents' store: true; never: false)
  --no-python, --monitor-interval SEC
                       accepted for torchrun command lines; no effect (worker
                       exits are seen at once)
  -h, --help           print this help

Each worker gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, NODE_RANK, MASTER_ADDR, MASTER_PORT, CCLITE_RDZV_ENDPOINT,
CCLITE_RDZV_ID, CCLITE_RDZV_TOKEN (derived from the id unless set),
TORCHELASTIC_RUN_ID and TORCHELASTIC_RESTART_COUNT; its stdin is /dev/null and it runs in its own process
group. SIGINT/SIGTERM/SIGHUP/SIGQUIT are forwarded to every worker (SIGKILL
10 s later); when a worker fails the others get SIGTERM (SIGKILL 5 s later).

exit status: 0 when every worker exits 0; else the first failed worker's
status (128+N if it was killed by signal N), on every node of the job; 1
when the rendezvous fails or a node is lost; 124 after --timeout; 128+N when
cclite-run itself got signal N; 127 (126) when program is missing (not
executable); 2 for a usage error.

examples:
  cclite-run --nproc-per-node 4 ./train --epochs 3
  # the same command on node0 and node1:
  cclite-run --nnodes 2 --nproc-per-node 4 --rdzv-id 100 \
             --rdzv-endpoint node0:29400 ./train
  # elastic: 2 to 4 nodes, up to 3 restarts (the program resumes its checkpoint)
  cclite-run --nnodes 2:4 --max-restarts 3 --nproc-per-node 4 --rdzv-id 100 \
             --rdzv-endpoint node0:29400 ./train --resume
  cclite-run --nproc_per_node=2 --timeout 600 --no-prefix ./allreduce_perf
  # from a Slurm allocation, one cclite-run per node: the nodes meet on the
  # step's first node, at MASTER_PORT or a port from SLURM_JOB_ID.SLURM_STEP_ID
  srun --nodes 2 --ntasks-per-node 1 cclite-run --nproc-per-node 4 ./train
)";
}

}  // namespace cclite::run
