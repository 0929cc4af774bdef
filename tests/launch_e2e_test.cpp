// End to end, the way users run it: build/bin/cclite-run starts real workers
// that call cclite::init() (environment -> TCP store hosted by rank 0 ->
// shm / tcp links). Checks hello_allreduce and allreduce_perf's #wrong column.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include <cclite/bootstrap/launch_env.hpp>  // slurm_port: the port the tasks derive

namespace {

std::string bin_dir() {
  const char* d = std::getenv("CCLITE_BIN_DIR");
  return d ? d : "build/bin";
}

struct run_out {
  int rc = -1;
  std::string text;
};

// Runs a shell command, capturing stdout and stderr.
run_out sh(const std::string& cmd) {
  run_out out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out.text += buf;
  int st = ::pclose(p);
  out.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return out;
}

// Data lines of allreduce_perf (not starting with '#' after the rank prefix).
std::vector<std::string> perf_rows(const std::string& text) {
  std::vector<std::string> rows;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto pos = line.find("]: ");
    std::string body = pos == std::string::npos ? line : line.substr(pos + 3);
    if (!body.empty() && body[0] != '#' && body.find("float") != std::string::npos) rows.push_back(body);
  }
  return rows;
}

// `env` that unsets every launcher's and rendezvous variable, so that a case
// starting workers by hand gives them only the variables it names.
const std::string no_launcher_env =
    "env -u RANK -u WORLD_SIZE -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u SLURM_PROCID -u CCLITE_RANK "
    "-u CCLITE_RDZV_ENDPOINT -u CCLITE_RDZV_DIR -u MASTER_ADDR -u MASTER_PORT -u CCLITE_RDZV_ID "
    "-u TORCHELASTIC_RUN_ID -u SLURM_JOB_ID -u SLURM_STEP_NODELIST ";

// How many times `what` occurs in `text`.
std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = 0; (at = text.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

}  // namespace

TEST_CASE("cclite-run + hello_allreduce: 3 ranks over shm, then over tcp") {
  const std::string run = bin_dir() + "/cclite-run --timeout 120 --nproc-per-node 3 ";
  for (const char* env : {"", "CCLITE_SHM_DISABLE=1 "}) {
    run_out r = sh(std::string(env) + run + bin_dir() + "/hello_allreduce");
    INFO(r.text);
    CHECK(r.rc == 0);
    CHECK(r.text.find("sum of ranks = 3 (correct)") != std::string::npos);
    CHECK(r.text.find("[rank 2]: ") != std::string::npos);
  }
}

TEST_CASE("cclite-run + allreduce_perf -c 1: #wrong is 0 on every line, shm and tcp") {
  const std::string cmd = bin_dir() + "/cclite-run --timeout 240 --nproc-per-node 2 " + bin_dir() +
                          "/allreduce_perf -b 8 -e 8M -f 8 -n 2 -w 1 -c 1";
  for (const char* env : {"", "CCLITE_SHM_DISABLE=1 "}) {
    run_out r = sh(std::string(env) + cmd);
    INFO(r.text);
    CHECK(r.rc == 0);
    auto rows = perf_rows(r.text);
    CHECK(rows.size() == 7);  // 8 B, 64 B, ..., 2 MiB (16 MiB > -e 8M)
    for (const auto& row : rows) {
      // columns: size count type redop | time algbw busbw #wrong | time algbw busbw #wrong
      std::istringstream f(row);
      std::string size, count, type, op, t1, a1, b1, w1, t2, a2, b2, w2;
      f >> size >> count >> type >> op >> t1 >> a1 >> b1 >> w1 >> t2 >> a2 >> b2 >> w2;
      CHECK(w1 == "0");
      CHECK(w2 == "0");
    }
  }
}

TEST_CASE("CCLITE_DEBUG=INFO prints topology, transport per peer and the algorithm") {
  run_out r = sh("CCLITE_DEBUG=INFO " + bin_dir() + "/cclite-run --timeout 60 --nproc-per-node 2 " +
                 bin_dir() + "/hello_allreduce");
  INFO(r.text);
  CHECK(r.rc == 0);
  CHECK(r.text.find("INFO init: rank 1 of 2") != std::string::npos);
  CHECK(r.text.find("via shm") != std::string::npos);
  CHECK(r.text.find("algorithm ring") != std::string::npos);
}

TEST_CASE("a worker without launcher environment gets one clear line") {
  run_out r = sh(no_launcher_env + bin_dir() + "/hello_allreduce");
  INFO(r.text);
  CHECK(r.rc != 0);
  CHECK(r.text.find("CCLITE_RANK") != std::string::npos);
}

TEST_CASE("rank 0 hosts the store, fails and returns at once: the others still report its failure") {
  // Three workers started by hand (no launcher to stop the others when rank 0
  // exits). Rank 0 aborts, records the failure in the store it hosts and
  // returns; ranks 1 and 2 call 0.5 s later. Its env_communicator keeps the
  // store up until they have disconnected, so they read the record.
  // Below the kernel's ephemeral ports (32768-60999), as cclite-run picks its own.
  const int port = 10000 + static_cast<int>(::getpid() % 20000);
  const std::string env = no_launcher_env + "CCLITE_WORLD_SIZE=3 CCLITE_TIMEOUT=20 CCLITE_RDZV_ENDPOINT=127.0.0.1:" +
                          std::to_string(port) + " ";
  std::string cmd;
  for (int r = 0; r < 3; ++r) {
    cmd += env + "CCLITE_RANK=" + std::to_string(r) + " " + bin_dir() + "/collectives_check --abort-rank0 & ";
  }
  run_out out = sh("(" + cmd + "wait)");  // the workers' stderr into the captured output too
  INFO(out.text);
  for (int r = 1; r < 3; ++r) {
    const std::string tag = "collectives_check: rank " + std::to_string(r) + ": ";
    const auto at = out.text.find(tag);
    REQUIRE(at != std::string::npos);
    const std::string line = out.text.substr(at, out.text.find('\n', at) - at);
    CHECK(line.find("the job's first failure") != std::string::npos);
    CHECK(line.find("rank 0") != std::string::npos);
    CHECK(line.find("aborted its communicator") != std::string::npos);
  }
}

TEST_CASE("Open MPI's variables, one node: ranks meet with no rendezvous variable (store in the session directory)") {
  // The variables Open MPI gives its ranks, set by hand: 3 workers that must
  // find each other through the session directory alone.
  char dir[] = "/tmp/cclite-e2e-session-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string env = no_launcher_env +
                          "CCLITE_TIMEOUT=60 OMPI_COMM_WORLD_SIZE=3 OMPI_COMM_WORLD_LOCAL_SIZE=3 "
                          "OMPI_MCA_ess_base_jobid=4242 PMIX_SERVER_TMPDIR=" + dir + " ";
  std::string cmd;
  for (int r = 0; r < 3; ++r)
    cmd += env + "OMPI_COMM_WORLD_RANK=" + std::to_string(r) + " OMPI_COMM_WORLD_LOCAL_RANK=" +
           std::to_string(r) + " " + bin_dir() + "/hello_allreduce & ";
  run_out out = sh("(" + cmd + "wait)");
  INFO(out.text);
  CHECK(occurrences(out.text, "sum of ranks = 3 (correct)") == 3);
  CHECK(sh(std::string("test -d ") + dir + "/cclite-rdzv/4242").rc == 0);  // where they met
  sh(std::string("rm -rf ") + dir);
  // mpirun itself: tests/netns/mpirun_test.sh (step 3).
}

TEST_CASE("srun's variables, no endpoint: ranks meet on the step's first node at a port from the job id") {
  // The variables srun gives its tasks, set by hand (there is no Slurm here):
  // 3 tasks on one node named localhost. The job id comes from this test's
  // pid, so parallel runs derive different ports.
  const std::string job = std::to_string(::getpid());
  const std::string env = no_launcher_env + "CCLITE_TIMEOUT=60 CCLITE_DEBUG=INFO SLURM_NTASKS=3 SLURM_JOB_ID=" +
                          job + " SLURM_STEP_ID=0 SLURM_STEP_NODELIST=localhost SLURMD_NODENAME=localhost ";
  std::string cmd;
  for (int r = 0; r < 3; ++r)
    cmd += env + "SLURM_PROCID=" + std::to_string(r) + " SLURM_LOCALID=" + std::to_string(r) + " " + bin_dir() +
           "/hello_allreduce & ";
  run_out out = sh("(" + cmd + "wait)");
  INFO(out.text);
  CHECK(occurrences(out.text, "sum of ranks = 3 (correct)") == 3);
  CHECK(out.text.find("srun: the first node of SLURM_STEP_NODELIST='localhost' and a port "
                      "from SLURM_JOB_ID.SLURM_STEP_ID") != std::string::npos);  // rank 0's INFO line

  // That port taken (another job's store, say): rank 0 names the port, where
  // it came from and what to set; the other rank gives up at its deadline.
  const std::uint16_t port = cclite::detail::slurm_port(job.c_str(), "1");
  const int busy = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(busy >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(busy, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::listen(busy, 8) == 0);
  cmd.clear();
  for (int r = 0; r < 2; ++r)
    cmd += env + "SLURM_NTASKS=2 SLURM_STEP_ID=1 CCLITE_TIMEOUT=3 SLURM_PROCID=" + std::to_string(r) + " " +
           bin_dir() + "/hello_allreduce & ";
  out = sh("(" + cmd + "wait)");
  ::close(busy);
  INFO(out.text);
  CHECK(out.text.find("Address already in use") != std::string::npos);
  CHECK(out.text.find("[endpoint localhost:" + std::to_string(port) +
                      " chosen for srun: the first node of SLURM_STEP_NODELIST='localhost'") != std::string::npos);
  CHECK(out.text.find("export MASTER_PORT or CCLITE_RDZV_ENDPOINT=host:port before srun]") != std::string::npos);
}

TEST_CASE("flight recorder under cclite-run: files in the run's log directory, the hint, cclite-trace reads them") {
  char tmpl[] = "/tmp/cclite-e2e-trace-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string logs = tmpl;
  // Rank 0 aborts its first allreduce; the others fail in it. Whichever
  // worker fails first makes cclite-run stop the rest, so at least one file.
  run_out r = sh("env -u CCLITE_TRACE_FILE CCLITE_TRACE_BUFFER=64 CCLITE_TIMEOUT=20 " + bin_dir() +
                 "/cclite-run --timeout 120 --nproc-per-node 3 --log-dir " + logs + " --tee 3 " + bin_dir() +
                 "/collectives_check --abort-rank0");
  INFO(r.text);
  CHECK(r.rc != 0);
  const std::string hint = "cclite-run: flight recorder: the workers that failed in a collective, or were asked for their files, wrote " + logs + "/";
  REQUIRE(r.text.find(hint) != std::string::npos);
  // The run's directory and the prefix, as the hint names them.
  const auto at = r.text.find(hint) + hint.size();
  const std::string prefix = logs + "/" + r.text.substr(at, r.text.find("<host>", at) - at);
  CHECK(prefix.find("/trace.") != std::string::npos);
  run_out files = sh("ls " + prefix + "*");
  INFO(files.text);
  REQUIRE(files.rc == 0);
  run_out rep = sh(bin_dir() + "/cclite-trace " + prefix + "*");
  INFO(rep.text);
  CHECK(rep.rc == 0);
  CHECK(rep.text.find("communicator cclite/0 (id ") != std::string::npos);
  CHECK(rep.text.find("furthest call: allreduce #1 (") != std::string::npos);
  CHECK((rep.text.find("failed (aborted)") != std::string::npos || rep.text.find("failed (peer_lost)") != std::string::npos));
  sh("rm -rf " + logs);
}

TEST_CASE("flight recorder under cclite-run: the workers still running are asked for their files before the stop") {
  char tmpl[] = "/tmp/cclite-e2e-trace-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  // Rank 2 exits with status 2 outside cclite; rank 1 is in its own code,
  // rank 0 waits for it in allreduce #2. Neither failed in a collective:
  // only cclite-run's request (SIGUSR1) makes them write a file.
  run_out r = sh("CCLITE_TRACE_BUFFER=16 CCLITE_TRACE_FILE=" + dir + "/t. CCLITE_TIMEOUT=60 " + bin_dir() +
                 "/cclite-run --timeout 120 --nproc-per-node 3 " + bin_dir() + "/collectives_check --stuck-rank1");
  INFO(r.text);
  CHECK(r.rc == 2);
  // (Rank 0 may have seen rank 2 leave and failed by then: then only rank 1 is asked.)
  CHECK((r.text.find("cclite-run: flight recorder: asked ranks 0, 1 for their files (SIGUSR1); stopping them once "
                     "written") != std::string::npos ||
         r.text.find("cclite-run: flight recorder: asked rank 1 for its file (SIGUSR1)") != std::string::npos));
  CHECK(r.text.find("cclite-trace " + dir + "/t.*") != std::string::npos);  // the hint
  CHECK(r.text.find("no file from") == std::string::npos);
  run_out rep = sh(bin_dir() + "/cclite-trace " + dir + "/t.*");
  INFO(rep.text);
  CHECK(rep.rc == 0);
  CHECK(rep.text.find("2 flight recorder files") != std::string::npos);  // ranks 0 and 1; rank 2 left none
  CHECK(rep.text.find("SIGUSR1: a dump on request") != std::string::npos);
  CHECK(rep.text.find("rank 1 never started collective #2; its last was allreduce #1 (1000 x float, sum), done in") !=
        std::string::npos);
  CHECK(rep.text.find("rank 2: no file") != std::string::npos);
  sh("rm -rf " + dir);
}
