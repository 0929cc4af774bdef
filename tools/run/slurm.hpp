// tools/run/slurm.hpp - cclite-run started by srun, one agent per node: the
// multi-node flags come from the step's variables, so that
//
//   srun --nodes 4 --ntasks-per-node 1 cclite-run --nproc-per-node 8 ./train
//
// needs neither --nnodes nor --rdzv-endpoint. The agents meet on the step's
// first node (SLURM_STEP_NODELIST: gpu[08-11] -> gpu08) at MASTER_PORT, else
// at a port derived from SLURM_JOB_ID.SLURM_STEP_ID: the same rules as a
// program started by srun without cclite-run (bootstrap/launch_env.hpp), and
// --rdzv-id defaults to that job id. Node ranks come from the agents'
// rendezvous (the first node is node 0), not from SLURM_NODEID.
#pragma once

#include <string>

#include <cclite/bootstrap/launch_env.hpp>

#include "options.hpp"

namespace cclite::run {

/// Applies srun's step to `o` when cclite-run runs as an srun task
/// (SLURM_STEP_NODELIST, SLURM_JOB_ID and SLURM_STEP_ID set) and the command
/// line places the job nowhere (no --rdzv-endpoint, --master-addr,
/// --node-rank or --standalone). `get` reads the environment (getenv).
/// `note` says what was derived, for the INFO log and the rendezvous's errors
/// ("" when nothing was). Returns a usage error, or "" on success. Runs
/// before validate() (parse_args' `adjust`), which then checks the result.
template <class Get>
std::string apply_srun(options& o, Get&& get, std::string& note) {
  note.clear();
  const char* nodelist = get("SLURM_STEP_NODELIST");
  const char* job = get("SLURM_JOB_ID");
  const char* step = get("SLURM_STEP_ID");
  if (!nodelist || !job || !step) return {};  // not an srun task
  if (!o.rdzv_endpoint.empty() || !o.master_addr.empty() || o.node_rank >= 0 || o.standalone) return {};
  auto count = [&](const char* step_var, const char* job_var) {
    const char* v = get(step_var);
    if (!v) v = get(job_var);
    int n = 0;
    return v && detail::parse_int(v, 1, 1 << 20, n) ? n : 0;
  };
  const int nodes = count("SLURM_STEP_NUM_NODES", "SLURM_NNODES");
  const int tasks = count("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS");
  if (!nodes || !tasks) return {};  // not enough to go on: the flags as given
  if (tasks != nodes)
    return "under srun, cclite-run runs once per node and starts the workers itself, but this step has " +
           std::to_string(tasks) + " tasks on " + std::to_string(nodes) +
           " node(s); use srun --ntasks-per-node 1 (or start the program with srun alone, without cclite-run)";
  if (nodes == 1) return {};  // one node: as without srun
  if (o.nnodes_given && (nodes > o.nnodes || nodes < (o.min_nnodes ? o.min_nnodes : o.nnodes)))
    return "--nnodes " + (o.min_nnodes ? std::to_string(o.min_nnodes) + ":" : std::string()) +
           std::to_string(o.nnodes) + " but this srun step runs on " + std::to_string(nodes) +
           " nodes; leave --nnodes out under srun";
  if (!o.nnodes_given) o.nnodes = nodes;
  const std::string host = cclite::detail::slurm_first_host(nodelist);
  if (host.empty())
    return std::string("cannot read the first node of SLURM_STEP_NODELIST='") + nodelist +
           "'; give --rdzv-endpoint host:port";
  const char* master_port = get("MASTER_PORT");
  int port = 0;
  if (master_port && !detail::parse_int(master_port, 1, 65535, port))
    return std::string("MASTER_PORT='") + master_port + "' is not a port (1..65535)";
  if (!port) port = cclite::detail::slurm_port(job, step);
  o.rdzv_endpoint = host + ":" + std::to_string(port);
  if (o.rdzv_id == "none") o.rdzv_id = std::string(job) + "." + step;
  note = "srun: " + std::to_string(nodes) + " nodes meet at " + o.rdzv_endpoint +
         ", the first node of SLURM_STEP_NODELIST='" + nodelist + "' and " +
         (master_port ? std::string("MASTER_PORT") : "a port from SLURM_JOB_ID.SLURM_STEP_ID") +
         "; to choose another, export MASTER_PORT or pass --rdzv-endpoint";
  return {};
}

}  // namespace cclite::run
