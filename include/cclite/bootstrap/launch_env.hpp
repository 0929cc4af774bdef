// cclite/bootstrap/launch_env.hpp - who am I, how many are we, where do we meet.
//
// detect_launch() reads the variables that launchers export, so the same
// binary runs under cclite-run, torchrun, mpirun (Open MPI, MPICH, Intel MPI)
// and srun. The first source that sets both its rank and its size wins:
//
//   launcher      rank / size                      local rank / size; node rank
//   "explicit"    CCLITE_RANK / CCLITE_WORLD_SIZE  CCLITE_LOCAL_RANK / CCLITE_LOCAL_WORLD_SIZE;
//                                                  CCLITE_NODE_RANK
//   "cclite-run"  RANK / WORLD_SIZE                LOCAL_RANK / LOCAL_WORLD_SIZE; GROUP_RANK
//   ("torchrun" when TORCHELASTIC_RUN_ID is set)
//   "openmpi"     OMPI_COMM_WORLD_RANK / _SIZE     OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE
//   "pmi"         PMI_RANK / PMI_SIZE              MPI_LOCALRANKID / MPI_LOCALNRANKS
//   "slurm"       SLURM_PROCID / SLURM_NTASKS      SLURM_LOCALID / SLURM_NTASKS_PER_NODE (only
//                                                  when a plain number); SLURM_NODEID
//
// CCLITE_LAUNCHER, when set, replaces the launcher name (a launcher may name itself).
// Local rank / size and node rank are hints; topology computes the truth.
//
// Rendezvous: CCLITE_RDZV_ENDPOINT=host:port ([v6addr]:port for IPv6), else
// MASTER_ADDR + MASTER_PORT, where rank 0 hosts the store unless
// TORCHELASTIC_USE_AGENT_STORE=True says torchrun's agent hosts one there
// (launcher_store below); CCLITE_RDZV_DIR (a directory every node mounts)
// is used when no endpoint is given. A job of one process needs neither, nor
// does an Open MPI job whose ranks are all on one node
// (OMPI_COMM_WORLD_LOCAL_SIZE = OMPI_COMM_WORLD_SIZE): its file store goes in
// mpirun's session directory (PMIX_SERVER_TMPDIR, or Open MPI 4's
// OMPI_MCA_orte_jobfam_session_dir), which mpirun creates for the run, shares
// with every local rank and removes at the end, so `mpirun -np 4 ./app` works
// as it does for an MPI program. Nor does an srun job: its ranks meet on
// the step's first node (SLURM_STEP_NODELIST, which only srun's tasks have;
// task 0 runs there under srun's block and cyclic distributions, and rank 0 checks
// SLURMD_NODENAME) at MASTER_PORT when set, else a port derived from the job
// and step ids (slurm_port, launch_parse.hpp), as PyTorch Lightning does on Slurm.
// Job id (separates jobs sharing a store or a directory): CCLITE_RDZV_ID,
// TORCHELASTIC_RUN_ID, SLURM_JOB_ID (".<SLURM_STEP_ID>" appended when set, so
// that two srun steps of one job do not meet), OMPI_MCA_ess_base_jobid,
// PMIX_NAMESPACE, else "default". An empty variable counts as unset.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include <cclite/bootstrap/launch_parse.hpp>
#include <cclite/config.hpp>
#include <cclite/core/status.hpp>

CCLITE_SETUP_CODE_BEGIN  // set-up code: compiled for size (config.hpp)

namespace cclite {

/// What the launcher told this process.
struct launch_info {
  int rank = -1, size = -1, local_rank = -1, local_size = -1;
  int node_rank = -1;
  /// "explicit", "cclite-run", "torchrun", "openmpi", "pmi", "slurm".
  std::string launcher;
  /// Rendezvous endpoint (rank 0 hosts the store there); host empty if none.
  /// An IPv6 host is kept without brackets.
  std::string rdzv_host;
  std::uint16_t rdzv_port = 0;
  /// Shared directory for a file store; empty if none.
  std::string rdzv_dir;
  /// Where rdzv_dir came from when no variable named it ("mpirun's session
  /// directory"); empty when it came from CCLITE_RDZV_DIR or is empty.
  std::string rdzv_dir_from;
  /// Where rdzv_host / rdzv_port came from when no variable named them (an
  /// srun job: "the first node of SLURM_STEP_NODELIST, port from ..."), for
  /// messages; empty otherwise.
  std::string rdzv_endpoint_from;
  std::string job_id;
  /// The launcher hosts the store at rdzv_host:rdzv_port itself: torchrun's
  /// agent runs a c10d TCPStore there and says so to its workers with
  /// TORCHELASTIC_USE_AGENT_STORE=True (MASTER_ADDR/MASTER_PORT, not
  /// CCLITE_RDZV_ENDPOINT). Every rank is then a client of it
  /// (tcp/torch_store.hpp) and no rank hosts a store.
  bool launcher_store = false;
  /// TORCHELASTIC_RUN_ID's attempt, TORCHELASTIC_RESTART_COUNT (0 when unset):
  /// the workers of a restart must not read the keys of the last attempt in
  /// the launcher's store, which outlives them.
  int restart_count = 0;
  /// The variables rank and size came from ("RANK/WORLD_SIZE"), for messages.
  std::string source;
};

namespace detail {

struct launch_source {
  const char* launcher;
  const char *rank, *size, *local_rank, *local_size, *node_rank;
};

}  // namespace detail

/// Reads the launcher environment through `get`.
/// Errors (errc::bootstrap_error, one line saying what to set): no launcher
/// variables; only one of a rank/size pair; a non-numeric or out-of-range
/// value ("RANK=5 but WORLD_SIZE=4"); a malformed endpoint or port; more than
/// one process but neither an endpoint nor a directory to meet at.
inline result<launch_info> detect_launch(const env_getter& get) {
  using detail::env_value;
  static const detail::launch_source sources[] = {
      {"explicit", "CCLITE_RANK", "CCLITE_WORLD_SIZE", "CCLITE_LOCAL_RANK", "CCLITE_LOCAL_WORLD_SIZE",
       "CCLITE_NODE_RANK"},
      {"cclite-run", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"},
      {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
      {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", nullptr},
      {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "SLURM_NODEID"},
  };
  launch_info li;
  const detail::launch_source* src = nullptr;
  const detail::launch_source* half = nullptr;  // first source with only one of the pair
  for (const auto& s : sources) {
    bool r = env_value(get, s.rank) != nullptr, z = env_value(get, s.size) != nullptr;
    if (r && z) {
      src = &s;
      break;
    }
    if ((r || z) && !half) half = &s;
    // CCLITE_* are an explicit request: half of them is an error even when a
    // launcher's variables are present.
    if (half == &sources[0]) break;
  }
  if (half && (!src || half == &sources[0])) {
    bool has_rank = env_value(get, half->rank) != nullptr;
    return make_error(errc::bootstrap_error, "cclite: %s is set but %s is not; set both (or neither)",
                      has_rank ? half->rank : half->size, has_rank ? half->size : half->rank);
  }
  if (!src)
    return make_error(errc::bootstrap_error,
                      "cclite: cannot tell this process's rank: no launcher environment found (looked for "
                      "RANK/WORLD_SIZE (torchrun, cclite-run), OMPI_COMM_WORLD_RANK/SIZE (mpirun), "
                      "PMI_RANK/PMI_SIZE, SLURM_PROCID/SLURM_NTASKS); start with cclite-run or set "
                      "CCLITE_RANK and CCLITE_WORLD_SIZE");

  li.launcher = src->launcher;
  if (src == &sources[1] && env_value(get, "TORCHELASTIC_RUN_ID")) li.launcher = "torchrun";
  if (const char* l = env_value(get, "CCLITE_LAUNCHER")) li.launcher = l;
  li.source = std::string(src->rank) + "/" + src->size;
  CCLITE_TRY(detail::read_int(get, src->rank, 0, li.rank));
  CCLITE_TRY(detail::read_int(get, src->size, 1, li.size));
  if (li.rank >= li.size)
    return make_error(
        errc::bootstrap_error,
        "cclite: %s=%d but %s=%d; a rank must be below the world size, check the launcher command", src->rank,
        li.rank, src->size, li.size);
  CCLITE_TRY(detail::read_int(get, src->local_rank, 0, li.local_rank));
  CCLITE_TRY(detail::read_int(get, src->node_rank, 0, li.node_rank));
  if (src->local_size) {
    CCLITE_TRY(detail::read_int(get, src->local_size, 1, li.local_size));
  } else if (const char* n = env_value(get, "SLURM_NTASKS_PER_NODE")) {
    long long x = 0;  // Slurm also writes "2(x3),1": a hint only when plain
    if (detail::parse_nonneg_int(n, li.size, x) && x >= 1) li.local_size = static_cast<int>(x);
  }
  if (li.local_rank >= 0 && li.local_size > 0 && li.local_rank >= li.local_size) {
    if (src->local_size)
      return make_error(errc::bootstrap_error, "cclite: %s=%d but %s=%d; check the launcher command",
                        src->local_rank, li.local_rank, src->local_size, li.local_size);
    li.local_size = -1;  // an inconsistent Slurm hint is dropped, not fatal
  }
  if (li.local_size > li.size)
    return make_error(errc::bootstrap_error, "cclite: %s=%d but %s=%d; check the launcher command",
                      src->local_size ? src->local_size : "SLURM_NTASKS_PER_NODE", li.local_size, src->size,
                      li.size);

  if (const char* d = env_value(get, "CCLITE_RDZV_DIR")) li.rdzv_dir = d;
  if (const char* ep = env_value(get, "CCLITE_RDZV_ENDPOINT")) {
    CCLITE_TRY(detail::parse_endpoint(ep, li.rdzv_host, li.rdzv_port));
  } else {
    const char* addr = env_value(get, "MASTER_ADDR");
    const char* port = env_value(get, "MASTER_PORT");
    // srun's tasks: the step's nodes (a step may use fewer nodes than the
    // job). Not the job's list: a batch script run without srun also has
    // SLURM_PROCID=0 and SLURM_NTASKS=N, and would wait for N-1 ranks that
    // never come; it gets the error below instead.
    const char* nodes_var = "SLURM_STEP_NODELIST";
    const char* nodes = src == &sources[4] ? env_value(get, nodes_var) : nullptr;
    if (addr && !port)
      return make_error(errc::bootstrap_error,
                        "cclite: MASTER_ADDR is set but MASTER_PORT is not; set both, or "
                        "CCLITE_RDZV_ENDPOINT=host:port");
    if (port && !addr && !nodes)
      return make_error(errc::bootstrap_error,
                        "cclite: MASTER_PORT is set but MASTER_ADDR is not; set both, or "
                        "CCLITE_RDZV_ENDPOINT=host:port");
    if (addr) {
      li.rdzv_host = addr;
      if (li.rdzv_host.size() > 2 && li.rdzv_host.front() == '[' && li.rdzv_host.back() == ']')
        li.rdzv_host = li.rdzv_host.substr(1, li.rdzv_host.size() - 2);
      CCLITE_TRY(detail::parse_port("MASTER_PORT", port, li.rdzv_port));
      // torch writes str(True) / str(False).
      const char* agent = env_value(get, "TORCHELASTIC_USE_AGENT_STORE");
      li.launcher_store = agent && (std::strcmp(agent, "True") == 0 || std::strcmp(agent, "1") == 0);
      if (li.launcher_store) CCLITE_TRY(detail::read_int(get, "TORCHELASTIC_RESTART_COUNT", 0, li.restart_count));
    } else if (nodes && li.size > 1 && (port || li.rdzv_dir.empty())) {
      // srun and no endpoint: meet on the step's first node, where srun puts task 0.
      li.rdzv_host = detail::slurm_first_host(nodes);
      if (li.rdzv_host.empty())
        return make_error(errc::bootstrap_error,
                          "cclite: cannot read the first node of %s='%s'; set CCLITE_RDZV_ENDPOINT=host:port "
                          "before srun",
                          nodes_var, nodes);
      const char* job = env_value(get, "SLURM_JOB_ID");
      const char* step = env_value(get, "SLURM_STEP_ID");
      if (port)
        CCLITE_TRY(detail::parse_port("MASTER_PORT", port, li.rdzv_port));
      else
        li.rdzv_port = detail::slurm_port(job, step);
      li.rdzv_endpoint_from = std::string("srun: the first node of ") + nodes_var + "='" + nodes + "' and " +
                              (port ? "MASTER_PORT" : "a port from SLURM_JOB_ID.SLURM_STEP_ID");
      // Under another distribution (-m arbitrary, a hostfile) task 0 may be
      // elsewhere: say so at once rather than let the others time out.
      const char* me = env_value(get, "SLURMD_NODENAME");
      if (li.rank == 0 && me && li.rdzv_host != me)
        return make_error(errc::bootstrap_error,
                          "cclite: rank 0 runs on node '%s', not on '%s', the first node of %s='%s', where "
                          "the ranks of an srun job meet; set CCLITE_RDZV_ENDPOINT=%s:<port> before srun",
                          me, li.rdzv_host.c_str(), nodes_var, nodes, me);
    }
  }
  if (li.size > 1 && li.rdzv_host.empty() && li.rdzv_dir.empty() && src == &sources[2] &&
      li.local_size == li.size) {
    // mpirun, whole job on this node (its own count, not a guess): the run's
    // session directory is private to it and seen by every rank (above).
    const char* session = env_value(get, "PMIX_SERVER_TMPDIR");
    if (!session) session = env_value(get, "OMPI_MCA_orte_jobfam_session_dir");
    if (session) {
      li.rdzv_dir = std::string(session) + "/cclite-rdzv";
      li.rdzv_dir_from = "mpirun's session directory";
    }
  }
  if (li.size > 1 && li.rdzv_host.empty() && li.rdzv_dir.empty()) {
    // How to pass a variable to every rank depends on the launcher: say it in its terms.
    const char* how = "";
    if (li.launcher == "openmpi")
      how = " (with mpirun: -x CCLITE_RDZV_ENDPOINT=<first host>:29400, or -x CCLITE_RDZV_DIR=<dir every "
            "node mounts>)";
    else if (li.launcher == "slurm")
      how = " (SLURM_STEP_NODELIST is unset: this process was not started by srun, as when a batch script "
            "runs the program itself; start it with srun, which needs no variable)";
    else if (li.launcher == "pmi")
      how = " (with mpiexec: -genv CCLITE_RDZV_ENDPOINT <first host>:29400)";
    return make_error(errc::bootstrap_error,
                      "cclite: rank %d of %d (from %s) has no rendezvous: set CCLITE_RDZV_ENDPOINT=host:port "
                      "(rank 0 hosts the store) or CCLITE_RDZV_DIR=/shared/dir%s",
                      li.rank, li.size, li.source.c_str(), how);
  }

  if (const char* id = env_value(get, "CCLITE_RDZV_ID")) {
    li.job_id = id;
  } else if (const char* t = env_value(get, "TORCHELASTIC_RUN_ID")) {
    li.job_id = t;
  } else if (const char* j = env_value(get, "SLURM_JOB_ID")) {
    li.job_id = j;
    if (const char* step = env_value(get, "SLURM_STEP_ID")) li.job_id += std::string(".") + step;
  } else if (const char* o = env_value(get, "OMPI_MCA_ess_base_jobid")) {
    li.job_id = o;
  } else if (const char* ns = env_value(get, "PMIX_NAMESPACE")) {
    li.job_id = ns;
  } else {
    li.job_id = "default";
  }
  return li;
}

/// The file-store directory of the job: `<rdzv_dir>/<job id>`, with the job
/// id made one safe path component (bytes outside [A-Za-z0-9._-] become '_',
/// "." and ".." get a '_' prefix), so an id like "a/../b" cannot escape.
inline std::string rdzv_store_dir(const launch_info& li) {
  std::string id;
  for (char c : li.job_id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-';
    id += ok ? c : '_';
  }
  if (id.empty() || id == "." || id == "..") id = "_" + id;
  return li.rdzv_dir + "/" + id;
}

/// detect_launch() on the process environment (::getenv).
inline result<launch_info> detect_launch() {
  return detect_launch([](const char* name) -> const char* { return std::getenv(name); });
}

}  // namespace cclite
CCLITE_SETUP_CODE_END
