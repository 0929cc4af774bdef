// detect_launch(): every launcher's variables, their precedence, and the
// one-line errors, on fake environments.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>

#include <cclite/bootstrap/launch_env.hpp>

using namespace cclite;

namespace {

using env_map = std::map<std::string, std::string>;

result<launch_info> detect(const env_map& env) {
  return detect_launch([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const env_map& env) {
  auto r = detect(env);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code() == errc::bootstrap_error);
  CHECK(r.error().message().find('\n') == std::string::npos);  // one line
  return r.error().message();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

const env_map endpoint{{"CCLITE_RDZV_ENDPOINT", "node0:29400"}};

env_map with(env_map a, const env_map& b) {
  for (const auto& kv : b) a[kv.first] = kv.second;
  return a;
}

}  // namespace

TEST_CASE("explicit CCLITE_RANK / CCLITE_WORLD_SIZE") {
  auto r = detect(with(endpoint, {{"CCLITE_RANK", "3"},
                                  {"CCLITE_WORLD_SIZE", "8"},
                                  {"CCLITE_LOCAL_RANK", "1"},
                                  {"CCLITE_LOCAL_WORLD_SIZE", "2"},
                                  {"CCLITE_NODE_RANK", "1"}}));
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->launcher == "explicit");
  CHECK(r->rank == 3);
  CHECK(r->size == 8);
  CHECK(r->local_rank == 1);
  CHECK(r->local_size == 2);
  CHECK(r->node_rank == 1);
  CHECK(r->rdzv_host == "node0");
  CHECK(r->rdzv_port == 29400);
  CHECK(r->job_id == "default");
  CHECK(r->source == "CCLITE_RANK/CCLITE_WORLD_SIZE");
}

TEST_CASE("torchrun / cclite-run") {
  env_map env{
      {"RANK", "5"},       {"WORLD_SIZE", "8"},         {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "4"},
      {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}};
  auto r = detect(env);
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->launcher == "cclite-run");
  CHECK(r->rank == 5);
  CHECK(r->size == 8);
  CHECK(r->local_rank == 1);
  CHECK(r->local_size == 4);
  CHECK(r->node_rank == 1);
  CHECK(r->rdzv_host == "10.0.0.1");
  CHECK(r->rdzv_port == 29500);

  env["TORCHELASTIC_RUN_ID"] = "run7";
  r = detect(env);
  CHECK(r->launcher == "torchrun");
  CHECK(r->job_id == "run7");

  env["CCLITE_LAUNCHER"] = "mylauncher";
  CHECK(detect(env)->launcher == "mylauncher");

  // The CCLITE endpoint wins over MASTER_ADDR/PORT; IPv6 in brackets.
  env["CCLITE_RDZV_ENDPOINT"] = "[fe80::1]:1234";
  r = detect(env);
  CHECK(r->rdzv_host == "fe80::1");
  CHECK(r->rdzv_port == 1234);
}

TEST_CASE("torchrun's agent store: TORCHELASTIC_USE_AGENT_STORE") {
  env_map env{{"RANK", "1"},
              {"WORLD_SIZE", "2"},
              {"MASTER_ADDR", "127.0.0.1"},
              {"MASTER_PORT", "29500"},
              {"TORCHELASTIC_RUN_ID", "none"},
              {"TORCHELASTIC_RESTART_COUNT", "2"}};
  auto r = detect(env);
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK_FALSE(r->launcher_store);  // torch 1.x's c10d rendezvous: worker rank 0 hosts
  CHECK(r->restart_count == 0);

  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  CHECK_FALSE(detect(env)->launcher_store);

  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";  // static rendezvous; c10d too from torch 2.4
  r = detect(env);
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->launcher_store);
  CHECK(r->restart_count == 2);
  CHECK(r->rdzv_host == "127.0.0.1");
  CHECK(r->rdzv_port == 29500);

  env["TORCHELASTIC_RESTART_COUNT"] = "-1";
  CHECK(contains(error_of(env), "TORCHELASTIC_RESTART_COUNT='-1'"));
  env.erase("TORCHELASTIC_RESTART_COUNT");
  CHECK(detect(env)->restart_count == 0);

  // An endpoint of cclite's own is the user's choice: rank 0 hosts there.
  env["CCLITE_RDZV_ENDPOINT"] = "127.0.0.1:29411";
  r = detect(env);
  CHECK_FALSE(r->launcher_store);
  CHECK(r->rdzv_port == 29411);
}

TEST_CASE("Open MPI") {
  auto r = detect(with(endpoint, {{"OMPI_COMM_WORLD_RANK", "15"},
                                  {"OMPI_COMM_WORLD_SIZE", "16"},
                                  {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                  {"OMPI_MCA_ess_base_jobid", "12345"}}));
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->launcher == "openmpi");
  CHECK(r->rank == 15);
  CHECK(r->size == 16);
  CHECK(r->local_rank == 3);
  CHECK(r->local_size == 4);
  CHECK(r->node_rank == -1);
  CHECK(r->job_id == "12345");
}

TEST_CASE("Open MPI on one node: the file store goes in mpirun's session directory, nothing to set") {
  const env_map one_node{{"OMPI_COMM_WORLD_RANK", "1"},
                         {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                         {"OMPI_MCA_ess_base_jobid", "1370095617"},
                         {"PMIX_SERVER_TMPDIR", "/tmp/ompi.vm.0/pid.15700"}};
  auto r = detect(one_node);
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->rdzv_host.empty());
  CHECK(r->rdzv_dir == "/tmp/ompi.vm.0/pid.15700/cclite-rdzv");
  CHECK(r->rdzv_dir_from == "mpirun's session directory");
  CHECK(rdzv_store_dir(*r) == "/tmp/ompi.vm.0/pid.15700/cclite-rdzv/1370095617");

  // Open MPI 4 without PMIx's variable: its job-family session directory.
  env_map v4 = one_node;
  v4.erase("PMIX_SERVER_TMPDIR");
  v4["OMPI_MCA_orte_jobfam_session_dir"] = "/tmp/ompi.vm.0/pid.99";
  CHECK(detect(v4)->rdzv_dir == "/tmp/ompi.vm.0/pid.99/cclite-rdzv");

  // Open MPI 5 (PRRTE): no ess job id; the PMIx namespace names the job.
  env_map v5 = one_node;
  v5.erase("OMPI_MCA_ess_base_jobid");
  v5["PMIX_NAMESPACE"] = "prterun-vm-15700@1";
  r = detect(v5);
  CHECK(r->job_id == "prterun-vm-15700@1");
  CHECK(rdzv_store_dir(*r) == "/tmp/ompi.vm.0/pid.15700/cclite-rdzv/prterun-vm-15700_1");

  // What the user set wins: an endpoint, or a directory.
  r = detect(with(one_node, endpoint));
  CHECK(r->rdzv_dir.empty());
  CHECK(r->rdzv_host == "node0");
  r = detect(with(one_node, {{"CCLITE_RDZV_DIR", "/shared/rdzv"}}));
  CHECK(r->rdzv_dir == "/shared/rdzv");
  CHECK(r->rdzv_dir_from.empty());

  // Ranks on several nodes do not share the session directory: still an error
  // that says what to set; so is a job with no session directory to use.
  CHECK(contains(error_of(with(one_node, {{"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})),
                 "with mpirun: -x CCLITE_RDZV_ENDPOINT="));
  env_map none = one_node;
  none.erase("PMIX_SERVER_TMPDIR");
  CHECK(contains(error_of(none), "has no rendezvous"));
  // Only Open MPI's own count of local ranks counts (the other launchers' are
  // hints or absent).
  CHECK(contains(error_of({{"PMI_RANK", "1"},
                           {"PMI_SIZE", "2"},
                           {"MPI_LOCALNRANKS", "2"},
                           {"PMIX_SERVER_TMPDIR", "/tmp/x"}}),
                 "has no rendezvous"));
}

TEST_CASE("PMI (MPICH, Intel MPI)") {
  auto r = detect(with(endpoint, {{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}}));
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->launcher == "pmi");
  CHECK(r->rank == 2);
  CHECK(r->local_rank == -1);
  CHECK(r->local_size == -1);
  r = detect(with(
      endpoint, {{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}}));
  CHECK(r->local_rank == 0);
  CHECK(r->local_size == 2);
}

TEST_CASE("Slurm") {
  env_map env = with(endpoint, {{"SLURM_PROCID", "6"},
                                {"SLURM_NTASKS", "8"},
                                {"SLURM_LOCALID", "2"},
                                {"SLURM_NTASKS_PER_NODE", "4"},
                                {"SLURM_NODEID", "1"},
                                {"SLURM_JOB_ID", "777"},
                                {"SLURM_STEP_ID", "0"}});
  auto r = detect(env);
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->launcher == "slurm");
  CHECK(r->rank == 6);
  CHECK(r->size == 8);
  CHECK(r->local_rank == 2);
  CHECK(r->local_size == 4);
  CHECK(r->node_rank == 1);
  CHECK(r->job_id == "777.0");

  env["SLURM_NTASKS_PER_NODE"] = "4(x2)";  // not a plain number: no hint
  CHECK(detect(env)->local_size == -1);
  env["SLURM_NTASKS_PER_NODE"] = "2";  // contradicts SLURM_LOCALID=2: dropped
  CHECK(detect(env)->local_size == -1);
}

TEST_CASE("Slurm without an endpoint: the ranks meet on the step's first node") {
  // What srun gives each task; no CCLITE_RDZV_ENDPOINT, MASTER_ADDR or directory.
  const env_map srun{{"SLURM_PROCID", "5"},          {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"},         {"SLURM_NODEID", "1"},
                     {"SLURM_JOB_ID", "123456"},     {"SLURM_STEP_ID", "0"},
                     {"SLURM_JOB_NODELIST", "gpu[07-10]"}, {"SLURM_STEP_NODELIST", "gpu[08-09]"},
                     {"SLURMD_NODENAME", "gpu09"}};
  auto r = detect(srun);
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->rdzv_host == "gpu08");  // the step's first node, not the job's
  CHECK(r->rdzv_port == 20000 + 3456);
  CHECK(r->rdzv_dir.empty());
  CHECK(contains(r->rdzv_endpoint_from, "SLURM_STEP_NODELIST='gpu[08-09]'"));
  CHECK(contains(r->rdzv_endpoint_from, "a port from SLURM_JOB_ID.SLURM_STEP_ID"));

  // A batch script that runs the program itself (no srun) has SLURM_PROCID=0,
  // SLURM_NTASKS and the job's node list, but no step list: an error at once,
  // not a wait for ranks that never start.
  env_map e = srun;
  e.erase("SLURM_STEP_NODELIST");
  e.erase("SLURM_STEP_ID");
  e["SLURM_PROCID"] = "0";
  std::string err = error_of(e);
  CHECK(contains(err, "rank 0 of 8 (from SLURM_PROCID/SLURM_NTASKS) has no rendezvous"));
  CHECK(contains(err, "this process was not started by srun"));

  // Concurrent steps of one job get different ports; so do neighbouring jobs.
  e = srun;
  std::set<int> ports;
  for (const char* step : {"0", "1", "2", "3"}) {
    e["SLURM_STEP_ID"] = step;
    ports.insert(detect(e)->rdzv_port);
  }
  e["SLURM_STEP_ID"] = "0";
  e["SLURM_JOB_ID"] = "123457";
  ports.insert(detect(e)->rdzv_port);
  CHECK(ports.size() == 5);
  for (int p : ports) CHECK((p >= 20000 && p < 30000));  // below the ephemeral range
  e["SLURM_JOB_ID"] = "job-x";  // not a number: hashed, still in range
  CHECK((detect(e)->rdzv_port >= 20000 && detect(e)->rdzv_port < 30000));

  // MASTER_PORT picks the port; the host still comes from the node list.
  r = detect(with(srun, {{"MASTER_PORT", "29500"}}));
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->rdzv_host == "gpu08");
  CHECK(r->rdzv_port == 29500);
  CHECK(contains(r->rdzv_endpoint_from, "MASTER_PORT"));
  // Anything the user named wins: an endpoint, MASTER_ADDR:MASTER_PORT, a directory.
  r = detect(with(srun, endpoint));
  CHECK(r->rdzv_host == "node0");
  CHECK(r->rdzv_endpoint_from.empty());
  r = detect(with(srun, {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}}));
  CHECK(r->rdzv_host == "10.0.0.1");
  CHECK(r->rdzv_endpoint_from.empty());
  r = detect(with(srun, {{"CCLITE_RDZV_DIR", "/shared/rdzv"}}));
  CHECK(r->rdzv_host.empty());
  CHECK(r->rdzv_dir == "/shared/rdzv");
  // One task needs no store at all.
  r = detect(with(srun, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURMD_NODENAME", "gpu08"}}));
  CHECK(r->rdzv_host.empty());
  // Other launchers' ranks never read Slurm's node list (a job started by
  // mpirun inside an allocation has its own rules).
  auto m = error_of(with(srun, {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}}));
  CHECK(contains(m, "has no rendezvous"));

  // Rank 0 must run on that node (srun's block and cyclic distributions put it
  // there); elsewhere (-m arbitrary) it says so instead of letting the others wait.
  err = error_of(with(srun, {{"SLURM_PROCID", "0"}, {"SLURMD_NODENAME", "gpu09"}}));
  CHECK(contains(err, "rank 0 runs on node 'gpu09', not on 'gpu08'"));
  CHECK(contains(err, "CCLITE_RDZV_ENDPOINT=gpu09:<port>"));
  r = detect(with(srun, {{"SLURM_PROCID", "0"}, {"SLURMD_NODENAME", "gpu08"}}));
  CHECK(r.ok());

  err = error_of(with(srun, {{"SLURM_STEP_NODELIST", "gpu[08-09"}}));
  CHECK(contains(err, "cannot read the first node of SLURM_STEP_NODELIST='gpu[08-09'"));
}

TEST_CASE("Slurm host lists: the first host") {
  using detail::slurm_first_host;
  CHECK(slurm_first_host("node01") == "node01");
  CHECK(slurm_first_host("node1,node2") == "node1");
  CHECK(slurm_first_host("node[01-04,07],login1") == "node01");
  CHECK(slurm_first_host("node[08,01-04]") == "node08");  // as written, not sorted
  CHECK(slurm_first_host("rack[1-2]-n[3-4]") == "rack1-n3");
  CHECK(slurm_first_host("n[1-2]-ib,m3") == "n1-ib");
  CHECK(slurm_first_host("node[1-2").empty());
  CHECK(slurm_first_host("node[]").empty());
  CHECK(slurm_first_host("node]1").empty());
  CHECK(slurm_first_host("").empty());
}

TEST_CASE("precedence: explicit > torchrun > Open MPI > PMI > Slurm") {
  env_map all = with(endpoint, {{"CCLITE_RANK", "0"},
                                {"CCLITE_WORLD_SIZE", "2"},
                                {"RANK", "1"},
                                {"WORLD_SIZE", "3"},
                                {"OMPI_COMM_WORLD_RANK", "2"},
                                {"OMPI_COMM_WORLD_SIZE", "4"},
                                {"PMI_RANK", "3"},
                                {"PMI_SIZE", "5"},
                                {"SLURM_PROCID", "4"},
                                {"SLURM_NTASKS", "6"}});
  CHECK(detect(all)->launcher == "explicit");
  all.erase("CCLITE_RANK");
  all.erase("CCLITE_WORLD_SIZE");
  CHECK(detect(all)->launcher == "cclite-run");
  all.erase("RANK");
  all.erase("WORLD_SIZE");
  CHECK(detect(all)->launcher == "openmpi");
  all.erase("OMPI_COMM_WORLD_RANK");
  all.erase("OMPI_COMM_WORLD_SIZE");
  CHECK(detect(all)->launcher == "pmi");
  all.erase("PMI_RANK");
  all.erase("PMI_SIZE");
  auto r = detect(all);
  CHECK(r->launcher == "slurm");
  CHECK(r->rank == 4);

  // A stray half pair of a launcher does not hide a complete lower one...
  all["WORLD_SIZE"] = "16";
  CHECK(detect(all)->launcher == "slurm");
  // ...but half of the explicit pair is an error.
  all["CCLITE_RANK"] = "1";
  CHECK(contains(error_of(all), "CCLITE_RANK is set but CCLITE_WORLD_SIZE is not"));

  // Job id precedence.
  env_map ids = with(endpoint, {{"RANK", "0"},
                                {"WORLD_SIZE", "2"},
                                {"CCLITE_RDZV_ID", "a"},
                                {"TORCHELASTIC_RUN_ID", "b"},
                                {"SLURM_JOB_ID", "c"},
                                {"OMPI_MCA_ess_base_jobid", "d"}});
  CHECK(detect(ids)->job_id == "a");
  ids.erase("CCLITE_RDZV_ID");
  CHECK(detect(ids)->job_id == "b");
  ids.erase("TORCHELASTIC_RUN_ID");
  CHECK(detect(ids)->job_id == "c");
  ids.erase("SLURM_JOB_ID");
  CHECK(detect(ids)->job_id == "d");
}

TEST_CASE("rendezvous sources") {
  env_map base{{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  auto r = detect(with(base, {{"CCLITE_RDZV_DIR", "/app/rdzv"}}));
  REQUIRE(r.ok());
  CHECK(r->rdzv_host.empty());
  CHECK(r->rdzv_dir == "/app/rdzv");

  r = detect(with(base, {{"MASTER_ADDR", "[::1]"}, {"MASTER_PORT", "29500"}}));
  REQUIRE(r.ok());
  CHECK(r->rdzv_host == "::1");

  // One process needs no rendezvous at all.
  r = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  REQUIRE(r.ok());
  CHECK(r->size == 1);
  CHECK(r->rdzv_host.empty());

  // Empty variables count as unset.
  r = detect({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"CCLITE_RDZV_ENDPOINT", ""}, {"CCLITE_RDZV_DIR", ""}});
  CHECK(r.ok());
}

TEST_CASE("errors: no rendezvous is explained in the launcher's own terms") {
  std::string e = error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  CHECK(contains(e, "has no rendezvous: set CCLITE_RDZV_ENDPOINT=host:port"));
  CHECK(contains(e, "CCLITE_RDZV_DIR=/shared/dir"));
  CHECK(contains(e, "with mpirun: -x CCLITE_RDZV_ENDPOINT="));
  CHECK(contains(error_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}), "start it with srun"));
  CHECK(contains(error_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}), "with mpiexec: -genv CCLITE_RDZV_ENDPOINT"));
  CHECK(error_of({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}}).find('\n') == std::string::npos);
}

TEST_CASE("errors: one clear line saying what to set") {
  std::string e = error_of({});
  CHECK(contains(e, "cannot tell this process's rank: no launcher environment found"));
  CHECK(contains(e, "RANK/WORLD_SIZE (torchrun, cclite-run)"));
  CHECK(contains(e, "OMPI_COMM_WORLD_RANK/SIZE (mpirun)"));
  CHECK(contains(e, "PMI_RANK/PMI_SIZE"));
  CHECK(contains(e, "SLURM_PROCID/SLURM_NTASKS"));
  CHECK(contains(e, "set CCLITE_RANK and CCLITE_WORLD_SIZE"));

  CHECK(contains(error_of(with(endpoint, {{"RANK", "5"}, {"WORLD_SIZE", "4"}})), "RANK=5 but WORLD_SIZE=4"));
  CHECK(contains(error_of(with(endpoint, {{"RANK", "abc"}, {"WORLD_SIZE", "4"}})),
                 "RANK='abc' is not a non-negative integer"));
  CHECK(contains(error_of(with(endpoint, {{"RANK", "-1"}, {"WORLD_SIZE", "4"}})), "RANK='-1'"));
  CHECK(contains(error_of(with(endpoint, {{"RANK", "0"}, {"WORLD_SIZE", "0"}})),
                 "WORLD_SIZE='0' is not a positive integer"));
  CHECK(contains(error_of(with(endpoint, {{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}})), "WORLD_SIZE="));
  CHECK(contains(error_of(with(endpoint, {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "x"}})),
                 "LOCAL_RANK='x'"));
  CHECK(contains(
      error_of(with(endpoint,
                    {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}})),
      "LOCAL_RANK=2 but LOCAL_WORLD_SIZE=2"));
  CHECK(contains(error_of({{"RANK", "0"}}), "RANK is set but WORLD_SIZE is not"));
  CHECK(contains(error_of({{"OMPI_COMM_WORLD_SIZE", "4"}}),
                 "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not"));

  e = error_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  CHECK(contains(
      e, "set CCLITE_RDZV_ENDPOINT=host:port (rank 0 hosts the store) or CCLITE_RDZV_DIR=/shared/dir"));
  CHECK(contains(e, "rank 1 of 4 (from OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)"));

  env_map two{{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  CHECK(contains(error_of(with(two, {{"CCLITE_RDZV_ENDPOINT", "node0"}})), "has no port"));
  CHECK(contains(error_of(with(two, {{"CCLITE_RDZV_ENDPOINT", "node0:http"}})),
                 "a port is a number in 1..65535"));
  CHECK(contains(error_of(with(two, {{"CCLITE_RDZV_ENDPOINT", "node0:70000"}})), "1..65535"));
  CHECK(contains(error_of(with(two, {{"CCLITE_RDZV_ENDPOINT", "node0:0"}})), "1..65535"));
  CHECK(contains(error_of(with(two, {{"CCLITE_RDZV_ENDPOINT", ":29400"}})), "has no host"));
  CHECK(contains(error_of(with(two, {{"CCLITE_RDZV_ENDPOINT", "fe80::1:29400"}})), "[addr]:port"));
  CHECK(contains(error_of(with(two, {{"CCLITE_RDZV_ENDPOINT", "[fe80::1]29400"}})), "[ipv6-address]:port"));
  CHECK(
      contains(error_of(with(two, {{"MASTER_ADDR", "node0"}})), "MASTER_ADDR is set but MASTER_PORT is not"));
  CHECK(contains(error_of(with(two, {{"MASTER_PORT", "1"}})), "MASTER_PORT is set but MASTER_ADDR is not"));
  CHECK(contains(error_of(with(two, {{"MASTER_ADDR", "n"}, {"MASTER_PORT", "x1"}})),
                 "MASTER_PORT has port 'x1'"));
  // A malformed port is an error even when one process would not need it.
  CHECK(
      contains(error_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"CCLITE_RDZV_ENDPOINT", "h:0"}}), "1..65535"));
}

TEST_CASE("rdzv_store_dir keeps the job id inside the directory") {
  launch_info li;
  li.rdzv_dir = "/app/rdzv";
  li.job_id = "777.0";
  CHECK(rdzv_store_dir(li) == "/app/rdzv/777.0");
  li.job_id = "../../etc";
  CHECK(rdzv_store_dir(li) == "/app/rdzv/.._.._etc");
  li.job_id = "..";
  CHECK(rdzv_store_dir(li) == "/app/rdzv/_..");
}

TEST_CASE("the process environment overload") {
  ::setenv("CCLITE_RANK", "0", 1);
  ::setenv("CCLITE_WORLD_SIZE", "1", 1);
  auto r = detect_launch();
  ::unsetenv("CCLITE_RANK");
  ::unsetenv("CCLITE_WORLD_SIZE");
  REQUIRE_MESSAGE(r.ok(), r.error().to_string());
  CHECK(r->launcher == "explicit");
}
