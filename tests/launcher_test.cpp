// tests/launcher_test.cpp - cclite-run, the torchrun-style launcher.
//
// Most cases run the real build/bin/cclite-run (found through CCLITE_BIN_DIR,
// set by ctest) on small /bin/sh workers and check its output, exit status and
// effect on the workers. The pure pieces (command line, endpoint parsing, line
// splitting) are also tested directly through tools/run/*.hpp.
//
// Elapsed-time bounds here are hang guards with generous margins, never
// performance assertions.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "../tools/run/cpu_bind.hpp"
#include "../tools/run/devices.hpp"
#include "../tools/run/job.hpp"
#include "../tools/run/line_splitter.hpp"
#include "../tools/run/options.hpp"
#include "../tools/run/placement.hpp"
#include "../tools/run/slurm.hpp"

namespace {

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

std::string launcher_path() {
  if (const char* dir = std::getenv("CCLITE_BIN_DIR"); dir && *dir)
    return std::string(dir) + "/cclite-run";
  // Run by hand: the test binary lives in build/bin/ next to cclite-run.
  char self[4096] = {};
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  std::string s = n > 0 ? std::string(self, static_cast<std::size_t>(n)) : std::string("./x");
  return s.substr(0, s.rfind('/')) + "/cclite-run";
}

struct run_output {
  int status = -1;  ///< exit status; 128+N if killed by signal N; -1 if the watchdog fired
  std::string out;
  std::string err;
  double seconds = 0;
};

/// cclite-run as a child process with its stdout and stderr captured and its
/// stdin an open pipe that nobody writes (so a worker reading stdin would hang
/// unless cclite-run gives it /dev/null).
class launcher {
 public:
  explicit launcher(const std::vector<std::string>& args,
                    const std::vector<std::string>& extra_env = {}) {
    int in[2], out[2], err[2];
    REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
    std::string path = launcher_path();
    std::vector<std::string> full{path};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);

    start_ = clock_type::now();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      // As if started from an interactive shell: a `ctest &` from a script
      // would otherwise hand down an ignored SIGINT, which cclite-run honours.
      for (int sig : {SIGINT, SIGQUIT, SIGHUP, SIGPIPE}) ::signal(sig, SIG_DFL);
      for (const auto& e : extra_env) ::putenv(const_cast<char*>(e.c_str()));
      ::dup2(in[0], 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execv(path.c_str(), argv.data());
      ::_exit(200);
    }
    ::close(in[0]);
    ::close(out[1]);
    ::close(err[1]);
    stdin_w_ = in[1];
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  launcher(const launcher&) = delete;
  launcher& operator=(const launcher&) = delete;

  ~launcher() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {stdin_w_, out_fd_, err_fd_})
      if (fd >= 0) ::close(fd);
  }

  /// Reads output until stdout holds `count` copies of `needle`; false on timeout.
  bool wait_for_stdout(const std::string& needle, int count, std::chrono::seconds limit) {
    auto until = clock_type::now() + limit;
    while (occurrences(out_, needle) < count) {
      if (clock_type::now() >= until || !pump(until)) return occurrences(out_, needle) >= count;
    }
    return true;
  }

  void send(int sig) { ::kill(pid_, sig); }

  /// Reads everything until cclite-run exits; SIGKILLs it after `limit` (the
  /// watchdog that turns a hang into a failed test).
  run_output finish(std::chrono::seconds limit = 60s) {
    auto until = clock_type::now() + limit;
    while (pump(until) && clock_type::now() < until) {
    }
    run_output r;
    int st = 0;
    for (;;) {
      pid_t w = ::waitpid(pid_, &st, WNOHANG);
      if (w == pid_) {
        r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        break;
      }
      if (clock_type::now() >= until) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        r.status = -1;
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    reaped_ = true;
    r.seconds = std::chrono::duration<double>(clock_type::now() - start_).count();
    r.out = out_;
    r.err = err_;
    if (r.status == -1) MESSAGE("watchdog fired; stderr so far:\n" << err_);
    return r;
  }

 private:
  static int occurrences(const std::string& s, const std::string& needle) {
    int n = 0;
    for (auto p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
    return n;
  }

  /// One poll round over stdout and stderr; false once both reached EOF.
  bool pump(clock_type::time_point until) {
    pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
    if (out_fd_ < 0 && err_fd_ < 0) return false;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - clock_type::now());
    int timeout = static_cast<int>(std::max<long long>(0, std::min<long long>(ms.count(), 200)));
    if (::poll(fds, 2, timeout) <= 0) return true;
    read_into(fds[0], out_fd_, out_);
    read_into(fds[1], err_fd_, err_);
    return out_fd_ >= 0 || err_fd_ >= 0;
  }

  static void read_into(const pollfd& p, int& fd, std::string& into) {
    if (fd < 0 || p.revents == 0) return;
    char buf[65536];
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      into.append(buf, static_cast<std::size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      ::close(fd);
      fd = -1;
    }
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  int stdin_w_ = -1, out_fd_ = -1, err_fd_ = -1;
  std::string out_, err_;
  clock_type::time_point start_;
};

run_output run(const std::vector<std::string>& args, std::vector<std::string> env = {}) {
  launcher l(args, env);
  return l.finish();
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// "[rank R]: rest" -> {R, rest} for every line of `s` (REQUIREs the format).
std::multimap<int, std::string> by_rank(const std::string& s) {
  std::multimap<int, std::string> m;
  for (const auto& line : lines_of(s)) {
    INFO("line: " << line);
    REQUIRE(line.rfind("[rank ", 0) == 0);
    auto close = line.find("]: ");
    REQUIRE(close != std::string::npos);
    m.emplace(std::stoi(line.substr(6, close - 6)), line.substr(close + 3));
  }
  return m;
}

bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

/// Running (a zombie waiting for its reaper counts as dead: it got its signal).
bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto paren = content.rfind(')');  // "pid (comm) S ..."
  return paren == std::string::npos || content.compare(paren + 1, 3, " Z ") != 0;
}

}  // namespace

// ---- the command line, without processes ---------------------------------------

TEST_CASE("options: torchrun spellings and --flag=value parse the same") {
  using cclite::run::parse_args;
  using cclite::run::parse_result;
  auto a =
      parse_args({"cclite-run", "--nproc-per-node", "4", "--nnodes=2", "--node_rank", "1",
                  "--rdzv-endpoint=node0:29400", "--rdzv_id", "job7", "./train", "--lr", "0.1"});
  REQUIRE(a.what == parse_result::action::run);
  CHECK(a.opts.nproc_per_node == 4);
  CHECK(a.opts.nnodes == 2);
  CHECK(a.opts.node_rank == 1);
  CHECK(a.opts.rdzv_endpoint == "node0:29400");
  CHECK(a.opts.rdzv_id == "job7");
  CHECK(a.opts.command == std::vector<std::string>{"./train", "--lr", "0.1"});

  auto b = parse_args({"cclite-run", "--nproc_per_node=3", "--no-prefix", "--timeout", "1.5", "--",
                       "--not-an-option"});
  REQUIRE(b.what == parse_result::action::run);
  CHECK(b.opts.nproc_per_node == 3);
  CHECK_FALSE(b.opts.prefix);
  CHECK(b.opts.timeout_s == doctest::Approx(1.5));
  CHECK(b.opts.command == std::vector<std::string>{"--not-an-option"});

  // torchrun's --rdzv-conf keys that cclite-run has a meaning for.
  auto c = parse_args({"cclite-run", "--rdzv_conf=join_timeout=45,last_call_timeout=2.5,is_host=false",
                       "--local_ranks_filter", "0,2", "x"});
  REQUIRE(c.what == parse_result::action::run);
  CHECK(c.opts.rdzv_timeout_s == doctest::Approx(45));
  CHECK(c.opts.rdzv_last_call_s == doctest::Approx(2.5));
  CHECK(c.opts.rdzv_is_host == 0);
  CHECK(cclite::run::shown_on_console(c.opts.local_ranks_filter, 2));
  CHECK_FALSE(cclite::run::shown_on_console(c.opts.local_ranks_filter, 1));
  CHECK(cclite::run::shown_on_console("", 1));
  CHECK(parse_args({"cclite-run", "--rdzv-conf", "is_host=1", "x"}).opts.rdzv_is_host == 1);
  CHECK(parse_args({"cclite-run", "--monitor_interval", "0.1", "x"}).what == parse_result::action::run);
}

TEST_CASE("options: mistakes are one clear line") {
  using cclite::run::parse_args;
  using cclite::run::parse_result;
  auto err = [](std::vector<std::string> args) {
    args.insert(args.begin(), "cclite-run");
    auto r = parse_args(args);
    CHECK(r.what == parse_result::action::usage_error);
    CHECK(r.error.find('\n') == std::string::npos);
    return r.error;
  };
  CHECK(contains(err({"--bogus", "x"}), "unknown option '--bogus'"));
  CHECK(contains(err({"--nproc-per-node", "abc", "x"}), "positive integer"));
  CHECK(contains(err({"--nproc-per-node", "0", "x"}), "positive integer"));
  CHECK(contains(err({"--nproc-per-node"}), "needs a value"));
  CHECK(contains(err({"--nproc-per-node", "2"}), "no program"));
  CHECK(contains(err({"--nnodes", "2", "x"}), "needs --rdzv-endpoint"));
  CHECK(contains(err({"--nnodes", "2", "--node-rank", "0", "x"}), "--rdzv-endpoint"));
  CHECK(contains(err({"--nnodes", "2", "--rdzv-backend", "static", "--rdzv-endpoint", "h:1", "x"}),
                 "--node-rank"));
  CHECK(contains(err({"--nnodes", "2", "--master-addr", "h", "x"}), "--node-rank"));
  CHECK(contains(err({"--rdzv-timeout", "0", "x"}), "seconds > 0"));
  CHECK(contains(err({"--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1", "x"}),
                 "out of range"));
  CHECK(contains(err({"--nnodes", "1:4", "x"}), "elastic"));
  CHECK(contains(err({"--master-port", "70000", "x"}), "1..65535"));
  CHECK(contains(err({"--max-restarts", "x", "x"}), "integer >= 0"));
  CHECK(contains(err({"--nnodes", "4:2", "--rdzv-endpoint", "h:1", "x"}), "MIN <= MAX"));
  CHECK(contains(err({"--nnodes", "1:2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "x"}), "elastic"));
  CHECK(contains(err({"--local-ranks-filter", "0,x", "x"}), "--local-ranks-filter '0,x': give local ranks"));
  CHECK(contains(err({"--local-ranks-filter", "", "x"}), "--local-ranks-filter needs"));
  CHECK(contains(err({"--rdzv-conf", "read_timeout=60", "x"}), "key 'read_timeout' is not supported"));
  CHECK(contains(err({"--rdzv-conf", "join_timeout", "x"}), "write key=value"));
  CHECK(contains(err({"--rdzv-conf", "join_timeout=0", "x"}), "seconds > 0"));
  CHECK(contains(err({"--rdzv-conf", "is_host=maybe", "x"}), "true or false"));
  CHECK(parse_args({"cclite-run", "--help"}).what == parse_result::action::help);
}

TEST_CASE("rendezvous: endpoint, master flags and defaults") {
  using namespace cclite::run;
  auto plan = [](std::vector<std::string> args) {
    args.insert(args.begin(), "cclite-run");
    args.push_back("prog");
    auto p = parse_args(args);
    REQUIRE(p.what == parse_result::action::run);
    rendezvous r;
    REQUIRE(plan_rendezvous(p.opts, r).empty());
    return r;
  };
  auto single = plan({});
  CHECK(single.master_addr == "127.0.0.1");
  CHECK(single.master_port == 0);  // chosen at launch
  REQUIRE(choose_free_port(single).empty());
  CHECK(single.master_port > 0);
  CHECK(single.endpoint == "127.0.0.1:" + std::to_string(single.master_port));

  auto ep = plan({"--rdzv-endpoint", "node0"});
  CHECK(ep.master_addr == "node0");
  CHECK(ep.master_port == 29400);
  CHECK(ep.endpoint == "node0:29400");

  auto v6 = plan({"--rdzv-endpoint", "[fe80::1]:1234"});
  CHECK(v6.master_addr == "fe80::1");
  CHECK(v6.endpoint == "[fe80::1]:1234");

  auto master = plan({"--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1"});
  CHECK(master.master_port == 29500);
  CHECK(master.endpoint == "10.0.0.1:29500");

  host_port hp;
  CHECK_FALSE(parse_host_port("host:0", 1, hp).empty());
  CHECK_FALSE(parse_host_port(":80", 1, hp).empty());
  CHECK_FALSE(parse_host_port("fe80::1:80", 1, hp).empty());  // needs brackets
}

TEST_CASE("placement: every node computes the same ranks and MASTER_ADDR from the round's list") {
  using namespace cclite::run;
  // Nodes with different --nproc-per-node: ranks follow node order.
  std::vector<node_info> nodes{parse_node_record("n0 10.0.0.1 2 100 1"), parse_node_record("n1 10.0.0.2 4 200 0"),
                               parse_node_record("n2 10.0.0.3 1 300 0")};
  CHECK(to_record(nodes[1]) == "n1 10.0.0.2 4 200 0");
  const int offsets[] = {0, 2, 6};
  for (int k = 0; k < 3; ++k) {
    rendezvous r;
    place_node(nodes, k, r);
    CHECK(r.node_rank == k);
    CHECK(r.group_size == 3);
    CHECK(r.rank_offset == offsets[k]);
    CHECK(r.world_size == 7);
  }
  std::string master;
  // Node 0 hosts the endpoint: the name every node reached it by...
  CHECK(choose_master_addr(nodes, "", "node0", false, master).empty());
  CHECK(master == "node0");
  // ...unless an interface is forced (its address), or --master-addr says.
  CHECK(choose_master_addr(nodes, "", "node0", true, master).empty());
  CHECK(master == "10.0.0.1");
  CHECK(choose_master_addr(nodes, "head", "node0", false, master).empty());
  CHECK(master == "head");
  // A loopback MASTER_ADDR cannot reach nodes on other hosts: refused now.
  nodes[0].addr = "127.0.0.1";
  const std::string err = choose_master_addr(nodes, "", "node0", true, master);
  CHECK(contains(err, "a loopback address, but the job spans several hosts"));
  CHECK(contains(err, "CCLITE_SOCKET_IFNAME"));
  // On one host (agents sharing a machine) loopback is fine.
  for (auto& n : nodes) n.host = "n0";
  CHECK(choose_master_addr(nodes, "", "127.0.0.1", false, master).empty());
}

TEST_CASE("srun: one cclite-run per node takes the node count and the meeting point from the step") {
  using namespace cclite::run;
  // What slurmstepd gives each task of `srun --nodes 2 --ntasks-per-node 1`.
  std::map<std::string, std::string> env = {{"SLURM_STEP_NODELIST", "gpu[08-09]"}, {"SLURM_JOB_ID", "4242"},
                                            {"SLURM_STEP_ID", "3"},           {"SLURM_STEP_NUM_NODES", "2"},
                                            {"SLURM_STEP_NUM_TASKS", "2"},    {"SLURM_NODEID", "1"}};
  auto apply = [&](std::vector<std::string> args, std::string& note) {
    args.insert(args.begin(), "cclite-run");
    args.push_back("prog");
    auto p = parse_args(args, [&](options& o) {
      return apply_srun(o, [&](const char* v) -> const char* {
        auto it = env.find(v);
        return it == env.end() ? nullptr : it->second.c_str();
      }, note);
    });
    return std::make_pair(p.opts, p.what == parse_result::action::run ? std::string() : p.error);
  };
  std::string note;
  auto [o, err] = apply({"--nproc-per-node", "4"}, note);
  CHECK(err.empty());
  CHECK(o.nnodes == 2);
  CHECK(o.rdzv_endpoint == "gpu08:" + std::to_string(cclite::detail::slurm_port("4242", "3")));
  CHECK(o.rdzv_id == "4242.3");
  CHECK(dynamic_rendezvous(o));  // node ranks from the agents' rendezvous
  CHECK(note.find("SLURM_STEP_NODELIST='gpu[08-09]'") != std::string::npos);

  env["MASTER_PORT"] = "31000";
  std::tie(o, err) = apply({"--rdzv-id", "mine"}, note);
  CHECK(o.rdzv_endpoint == "gpu08:31000");
  CHECK(o.rdzv_id == "mine");  // an id given stays
  CHECK(note.find("MASTER_PORT") != std::string::npos);

  std::tie(o, err) = apply({"--nnodes", "2"}, note);  // the same count: fine
  CHECK(err.empty());
  std::tie(o, err) = apply({"--nnodes", "3"}, note);
  CHECK(err.find("this srun step runs on 2 nodes") != std::string::npos);

  // The command line places the job: left alone.
  std::tie(o, err) = apply({"--nnodes", "2", "--rdzv-endpoint", "login1:29400"}, note);
  CHECK((err.empty() && note.empty() && o.rdzv_endpoint == "login1:29400"));
  std::tie(o, err) = apply({"--standalone"}, note);
  CHECK((err.empty() && note.empty() && o.nnodes == 1));

  env["SLURM_STEP_NUM_TASKS"] = "8";  // srun --ntasks-per-node 4: four agents per node
  std::tie(o, err) = apply({}, note);
  CHECK(err.find("use srun --ntasks-per-node 1") != std::string::npos);

  env["SLURM_STEP_NUM_TASKS"] = "1";
  env["SLURM_STEP_NUM_NODES"] = "1";  // one node: as without srun
  std::tie(o, err) = apply({}, note);
  CHECK((err.empty() && note.empty() && o.nnodes == 1 && o.rdzv_endpoint.empty()));

  env.erase("SLURM_STEP_NODELIST");  // a batch script, not an srun task
  env["SLURM_STEP_NUM_TASKS"] = env["SLURM_STEP_NUM_NODES"] = "2";
  std::tie(o, err) = apply({}, note);
  CHECK((err.empty() && note.empty() && o.nnodes == 1));
}

TEST_CASE("options: --nproc-per-node gpu|cpu|auto count this machine's GPUs or CPUs") {
  using namespace cclite::run;
  // A stand-in for /proc/driver/nvidia/gpus with `n` GPUs.
  char tmpl[] = "/tmp/cclite-gpus-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string dir = tmpl;
  auto gpus = [&](int n) {
    for (int i = 0; i < 8; ++i) ::rmdir((dir + "/0000:0" + std::to_string(i) + ":00.0").c_str());
    for (int i = 0; i < n; ++i) REQUIRE(::mkdir((dir + "/0000:0" + std::to_string(i) + ":00.0").c_str(), 0700) == 0);
  };
  const char* visible = nullptr;
  auto resolve = [&](const std::string& spec, std::string& err) {
    auto p = parse_args({"cclite-run", "--nproc-per-node", spec, "prog"});
    REQUIRE(p.what == parse_result::action::run);
    options o = p.opts;
    err = resolve_nproc(o, [&](const char*) { return visible; }, dir);
    return o.nproc_per_node;
  };
  std::string err;
  cpu_set_t set;
  REQUIRE(::sched_getaffinity(0, sizeof set, &set) == 0);
  const int cpus = CPU_COUNT(&set);
  gpus(4);
  CHECK(resolve("gpu", err) == 4);
  CHECK(resolve("auto", err) == 4);
  CHECK(resolve("cpu", err) == cpus);
  CHECK(resolve("3", err) == 3);
  visible = "2,0";
  CHECK(resolve("gpu", err) == 2);
  visible = "1,7,2";  // 7 does not exist: the runtime stops there
  CHECK(resolve("gpu", err) == 1);
  visible = "GPU-5f1e0b9a-aaaa-bbbb-cccc-0123456789ab";
  CHECK(resolve("gpu", err) == 1);
  visible = "";  // hides every GPU
  CHECK(resolve("auto", err) == cpus);
  CHECK(err.empty());
  resolve("gpu", err);
  CHECK(err.find("CUDA_VISIBLE_DEVICES='' hides them") != std::string::npos);
  visible = nullptr;
  gpus(0);
  CHECK(resolve("auto", err) == cpus);
  resolve("gpu", err);
  CHECK(err.find("no GPU here") != std::string::npos);
  auto bad = parse_args({"cclite-run", "--nproc-per-node", "gpus", "prog"});
  CHECK(bad.what == parse_result::action::usage_error);
  CHECK(bad.error.find("gpu, cpu or auto") != std::string::npos);
  ::rmdir(dir.c_str());

  // The launcher itself: one worker per usable CPU; "gpu" where the driver
  // lists no GPU (this machine, unless it has one) is a usage error.
  launcher l({"--nproc-per-node", "cpu", "/bin/sh", "-c", "echo $LOCAL_WORLD_SIZE"});
  auto r = l.finish();
  INFO(r.err);
  CHECK(r.status == 0);
  auto lines = by_rank(r.out);
  CHECK(lines.size() == static_cast<std::size_t>(cpus));
  for (const auto& [rank, line] : lines) CHECK(line == std::to_string(cpus));
  if (visible_gpus(std::getenv("CUDA_VISIBLE_DEVICES")) == 0) {
    launcher g({"--nproc-per-node", "gpu", "/bin/true"});
    auto rg = g.finish();
    CHECK(rg.status == 2);
    CHECK(rg.err.find("--nproc-per-node gpu: no GPU here") != std::string::npos);
  }
}

TEST_CASE("--bind-to: CPU lists, and how cores and NUMA nodes are shared out") {
  using namespace cclite::run;
  std::vector<int> v;
  CHECK(parse_cpu_list("0-3,8,10-11\n", v));
  CHECK(v == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(parse_cpu_list("", v));
  CHECK(v.empty());
  CHECK_FALSE(parse_cpu_list("0-x", v));
  CHECK_FALSE(parse_cpu_list("3-1", v));
  CHECK_FALSE(parse_cpu_list("1,,2", v));
  CHECK(cpu_list_string({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11");
  CHECK(cpu_list_string({5}) == "5");

  // Two packages (= NUMA nodes) of 4 cores with 2 hyperthreads each, numbered
  // as Linux does: core k's threads are CPUs k and k + 8.
  std::vector<cpu_place> cpus;
  for (int t = 0; t < 2; ++t)
    for (int k = 0; k < 8; ++k) cpus.push_back(cpu_place{k + 8 * t, k / 4, k / 4, k % 4});
  bool shared = true;
  auto core4 = cpu_sets_for(cpus, "core", 4, &shared);
  CHECK_FALSE(shared);
  REQUIRE(core4.size() == 4);
  CHECK(core4[0] == std::vector<int>{0, 1, 8, 9});  // two whole cores, both threads
  CHECK(core4[3] == std::vector<int>{6, 7, 14, 15});
  auto numa2 = cpu_sets_for(cpus, "numa", 2, &shared);
  REQUIRE(numa2.size() == 2);
  CHECK(numa2[0] == std::vector<int>{0, 1, 2, 3, 8, 9, 10, 11});
  CHECK(numa2[1] == std::vector<int>{4, 5, 6, 7, 12, 13, 14, 15});
  auto core3 = cpu_sets_for(cpus, "core", 3, &shared);  // 8 cores: 2, 3, 3
  REQUIRE(core3.size() == 3);
  CHECK(core3[0].size() == 4);
  CHECK(core3[1].size() == 6);
  CHECK(core3[2].size() == 6);
  auto many = cpu_sets_for(cpus, "core", 10, &shared);  // more workers than cores
  CHECK(shared);
  REQUIRE(many.size() == 10);
  CHECK(many[8] == many[0]);
  CHECK(many[9] == std::vector<int>{1, 9});
  CHECK(cpu_sets_for(cpus, "none", 2).empty());
  CHECK(cpu_sets_for({}, "core", 2).empty());

  // read_cpu_places on a sysfs tree of its own: node 1 holds CPUs 2-3; CPU 3
  // has no topology files (a core of its own).
  char tmpl[] = "/tmp/cclite-sysfs-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string sys = tmpl;
  auto write = [](const std::string& path, const std::string& text) {
    std::ofstream(path) << text;
  };
  for (const char* d : {"/node", "/node/node0", "/node/node1", "/cpu", "/cpu/cpu0", "/cpu/cpu0/topology", "/cpu/cpu1",
                        "/cpu/cpu1/topology", "/cpu/cpu2", "/cpu/cpu2/topology"})
    REQUIRE(::mkdir((sys + d).c_str(), 0700) == 0);
  write(sys + "/node/node0/cpulist", "0-1\n");
  write(sys + "/node/node1/cpulist", "2-3\n");
  for (int c = 0; c < 3; ++c) {
    write(sys + "/cpu/cpu" + std::to_string(c) + "/topology/physical_package_id", c < 2 ? "0\n" : "1\n");
    write(sys + "/cpu/cpu" + std::to_string(c) + "/topology/core_id", "0\n");  // CPUs 0 and 1: one core
  }
  auto places = read_cpu_places(sys, {0, 1, 2, 3});
  REQUIRE(places.size() == 4);
  CHECK(places[2].node == 1);
  CHECK(places[2].package == 1);
  CHECK(places[3].node == 1);
  auto by_core = cpu_sets_for(places, "core", 3, &shared);
  REQUIRE(by_core.size() == 3);
  CHECK(by_core[0] == std::vector<int>{0, 1});
  CHECK(by_core[1] == std::vector<int>{3});  // node 1: CPU 3 (core id -4) sorts before CPU 2's core 0
  CHECK(by_core[2] == std::vector<int>{2});
  CHECK(cpu_sets_for(places, "numa", 2)[1] == std::vector<int>{2, 3});
  CHECK(std::system(("rm -rf " + sys).c_str()) == 0);
}

TEST_CASE("--bind-to core|numa: each worker runs on its own share of the launcher's CPUs") {
  using namespace cclite::run;
  // What the workers must see: the shares computed here from this process's
  // CPUs (the launcher runs with the same ones), as Cpus_allowed_list prints them.
  auto own = read_cpu_places();
  REQUIRE_FALSE(own.empty());
  std::vector<int> all;
  for (const auto& p : own) all.push_back(p.cpu);
  std::sort(all.begin(), all.end());
  for (const char* how : {"core", "numa", "none"}) {
    INFO("--bind-to " << how);
    launcher l({"--bind-to", how, "--nproc-per-node", "2", "/bin/sh", "-c",
                "grep Cpus_allowed_list /proc/self/status | cut -f2"});
    auto r = l.finish();
    INFO(r.err);
    CHECK(r.status == 0);
    auto lines = by_rank(r.out);
    REQUIRE(lines.size() == 2);
    auto want = cpu_sets_for(own, how, 2);
    for (const auto& [rank, line] : lines) {
      INFO("rank " << rank << ": " << line);
      CHECK(line == cpu_list_string(want.empty() ? all : want[static_cast<std::size_t>(rank)]));
    }
  }
  CHECK(cclite::run::parse_args({"cclite-run", "--bind-to", "socket", "x"}).error.find("none, core or numa") !=
        std::string::npos);
}

TEST_CASE("line_splitter: whole prefixed lines, partial line at EOF") {
  cclite::run::line_splitter s("[rank 2]: ");
  CHECK(s.feed("hel") == "");
  CHECK(s.feed("lo\nwor") == "[rank 2]: hello\n");
  CHECK(s.feed("ld\n\nx") == "[rank 2]: world\n[rank 2]: \n");
  CHECK(s.finish() == "[rank 2]: x\n");
  CHECK(s.finish() == "");

  cclite::run::line_splitter plain("");
  CHECK(plain.feed("a\nb") == "a\n");
  CHECK(plain.finish() == "b");  // unchanged without a prefix

  cclite::run::line_splitter big("[rank 0]: ");
  std::string huge(cclite::run::line_splitter::max_pending + 10, 'z');
  CHECK(big.feed(huge).size() == huge.size() + 11);  // bounded: emitted in a piece
}

// ---- the real launcher ------------------------------------------------------------

TEST_CASE("launcher: environment of three workers on one node") {
  auto r = run({"--nproc-per-node", "3", "/bin/sh", "-c",
                "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT "
                "$GROUP_RANK $NODE_RANK $CCLITE_RDZV_ENDPOINT $CCLITE_RDZV_ID "
                "$TORCHELASTIC_RUN_ID\""},
               {"RANK=99", "WORLD_SIZE=99"});  // an outer launcher's values must not leak
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  auto lines = by_rank(r.out);
  REQUIRE(lines.size() == 3);
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    REQUIRE(lines.count(rank) == 1);
    std::istringstream in(lines.find(rank)->second);
    std::string rk, world, local, local_world, addr, p, group, node, endpoint, id, run_id;
    in >> rk >> world >> local >> local_world >> addr >> p >> group >> node >> endpoint >> id >>
        run_id;
    CHECK(rk == std::to_string(rank));
    CHECK(world == "3");
    CHECK(local == std::to_string(rank));
    CHECK(local_world == "3");
    CHECK(addr == "127.0.0.1");
    CHECK(std::stoi(p) > 0);
    CHECK(std::stoi(p) <= 65535);
    if (rank == 0) port = p;
    CHECK(p == port);  // one rendezvous port for all
    CHECK(group == "0");
    CHECK(node == "0");
    CHECK(endpoint == "127.0.0.1:" + port);
    CHECK(id == "none");
    CHECK(run_id == "none");
  }
}

TEST_CASE("launcher: second node of a static multi-node job") {
  auto r = run({"--nnodes=2", "--node_rank=1", "--nproc_per_node=2", "--rdzv-endpoint=node0:29411",
                "--rdzv-backend=static", "--rdzv-id=job42", "/bin/sh", "-c",
                "echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $NODE_RANK $MASTER_ADDR "
                "$MASTER_PORT $CCLITE_RDZV_ENDPOINT $CCLITE_RDZV_ID $TORCHELASTIC_RUN_ID"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  auto lines = by_rank(r.out);
  REQUIRE(lines.size() == 2);
  CHECK(lines.find(2)->second == "2 4 0 1 1 node0 29411 node0:29411 job42 job42");
  CHECK(lines.find(3)->second == "3 4 1 1 1 node0 29411 node0:29411 job42 job42");
}

TEST_CASE("launcher: --master-addr/--master-port set MASTER_* and the endpoint") {
  auto r = run({"--master-addr", "10.1.2.3", "--master-port", "29555", "/bin/sh", "-c",
                "echo $MASTER_ADDR $MASTER_PORT $CCLITE_RDZV_ENDPOINT"});
  CHECK(r.status == 0);
  CHECK(r.out == "[rank 0]: 10.1.2.3 29555 10.1.2.3:29555\n");
}

TEST_CASE("launcher: stdout and stderr keep apart, every line prefixed") {
  auto r = run({"--nproc-per-node", "2", "/bin/sh", "-c",
                "echo out-$RANK; echo err-$RANK >&2; printf tail-$RANK"});
  CHECK(r.status == 0);
  auto out = by_rank(r.out);
  CHECK(out.size() == 4);
  CHECK(contains(r.out, "[rank 0]: out-0\n"));
  CHECK(contains(r.out, "[rank 1]: out-1\n"));
  CHECK(contains(r.out, "[rank 1]: tail-1\n"));  // partial last line flushed at EOF
  CHECK_FALSE(contains(r.out, "err-"));
  const bool either_order = r.err == "[rank 0]: err-0\n[rank 1]: err-1\n" ||
                            r.err == "[rank 1]: err-1\n[rank 0]: err-0\n";
  CHECK_MESSAGE(either_order, r.err);
}

namespace {

std::string file_text(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "<missing>";
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// The run directory cclite-run named on stderr ("worker logs in DIR").
std::string logs_dir(const std::string& err) {
  const std::string key = "worker logs in ";
  auto at = err.find(key);
  if (at == std::string::npos) return {};
  at += key.size();
  return err.substr(at, err.find('\n', at) - at);
}

}  // namespace

TEST_CASE("launcher: --log-dir with --tee and --redirects, per local rank and per restart") {
  char tmpl[] = "/tmp/cclite-logs-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string base = tmpl;
  // stdout of every worker teed (files and console); rank 0's stderr redirected (file only).
  launcher a({"--nproc-per-node", "2", "--log-dir", base, "--tee", "1", "-r", "0:2", "--rdzv-id", "job/7",
              "/bin/sh", "-c", "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2"});
  auto ra = a.finish();
  INFO(ra.out << ra.err);
  REQUIRE(ra.status == 0);
  CHECK(ra.out.find("[rank 0]: out0\n") != std::string::npos);
  CHECK(ra.out.find("[rank 1]: out1\n") != std::string::npos);
  CHECK(ra.err.find("[rank 1]: err1\n") != std::string::npos);
  CHECK(ra.err.find("err0") == std::string::npos);  // redirected: its file only
  const std::string dir = logs_dir(ra.err);
  CHECK(dir.rfind(base + "/job_7_", 0) == 0);  // the id made one path component
  CHECK(file_text(dir + "/attempt_0/0/stdout.log") == "out0\n");  // as written, no prefix
  CHECK(file_text(dir + "/attempt_0/0/stderr.log") == "err0\n");
  CHECK(file_text(dir + "/attempt_0/1/stdout.log") == "out1\n");
  CHECK(file_text(dir + "/attempt_0/1/stderr.log") == "<missing>");  // neither teed nor redirected

  // A restart writes under attempt_1; redirected output stays off the console.
  launcher b({"--log-dir", base, "--redirects", "3", "--max-restarts", "1", "/bin/sh", "-c",
              "echo try$TORCHELASTIC_RESTART_COUNT; [ $TORCHELASTIC_RESTART_COUNT = 1 ]"});
  auto rb = b.finish();
  INFO(rb.out << rb.err);
  CHECK(rb.status == 0);
  CHECK(rb.out.find("try") == std::string::npos);
  const std::string dir_b = logs_dir(rb.err);
  CHECK(file_text(dir_b + "/attempt_0/0/stdout.log") == "try0\n");
  CHECK(file_text(dir_b + "/attempt_1/0/stdout.log") == "try1\n");

  // No --log-dir: a fresh directory in $TMPDIR.
  launcher c({"-t", "3", "/bin/sh", "-c", "echo hi"}, {"TMPDIR=" + base});
  auto rc = c.finish();
  CHECK(rc.status == 0);
  CHECK(logs_dir(rc.err).rfind(base + "/cclite-run_none_", 0) == 0);
  CHECK(file_text(logs_dir(rc.err) + "/attempt_0/0/stdout.log") == "hi\n");

  for (const char* bad : {"4", "0:x", "1,2", "0:1,"}) {
    launcher d({"--redirects", bad, "/bin/true"});
    auto rd = d.finish();
    CHECK_MESSAGE(rd.status == 2, bad);
    CHECK(rd.err.find("--redirects '" + std::string(bad) + "': give 0 (none)") != std::string::npos);
  }
  std::string cleanup = "rm -rf '" + base + "'";
  CHECK(std::system(cleanup.c_str()) == 0);
}

TEST_CASE("launcher: --local-ranks-filter keeps the other ranks' output in their log files") {
  char tmpl[] = "/tmp/cclite-logs-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::string base = tmpl;
  // Rank 2 fails only once ranks 0 and 1 have written both lines: a failure
  // stops the others, and a rank stopped before it wrote has nothing to show.
  launcher a({"--nproc-per-node", "3", "--log-dir", base, "--local-ranks-filter", "1", "/bin/sh", "-c",
              "echo out$LOCAL_RANK; echo err$LOCAL_RANK >&2; touch " + base + "/wrote$LOCAL_RANK; "
              "if [ $LOCAL_RANK = 2 ]; then while [ ! -e " + base + "/wrote0 ] || [ ! -e " + base +
              "/wrote1 ]; do sleep 0.02; done; exit 3; fi; sleep 5"});
  auto ra = a.finish();
  INFO(ra.out << ra.err);
  CHECK(ra.status == 3);
  CHECK(ra.out == "[rank 1]: out1\n");  // only the filtered rank on the console
  CHECK(contains(ra.err, "[rank 1]: err1\n"));
  CHECK_FALSE(contains(ra.err, "err0"));
  CHECK_FALSE(contains(ra.err, "err2"));
  CHECK(contains(ra.err, "rank 2 (host "));  // cclite-run's own lines still name every rank
  const std::string dir = logs_dir(ra.err);
  CHECK(file_text(dir + "/attempt_0/0/stdout.log") == "out0\n");  // nothing lost
  CHECK(file_text(dir + "/attempt_0/0/stderr.log") == "err0\n");
  CHECK(file_text(dir + "/attempt_0/2/stderr.log") == "err2\n");
  CHECK(file_text(dir + "/attempt_0/1/stdout.log") == "<missing>");  // shown, not teed

  // With --tee 3 (torchrun's usual pairing) every rank's files, rank 0 alone here.
  launcher b({"--nproc-per-node", "2", "--log-dir", base, "--tee", "3", "--local-ranks-filter", "0",
              "/bin/sh", "-c", "echo out$LOCAL_RANK"});
  auto rb = b.finish();
  INFO(rb.out << rb.err);
  CHECK(rb.status == 0);
  CHECK(rb.out == "[rank 0]: out0\n");
  CHECK(file_text(logs_dir(rb.err) + "/attempt_0/0/stdout.log") == "out0\n");
  CHECK(file_text(logs_dir(rb.err) + "/attempt_0/1/stdout.log") == "out1\n");
  std::string cleanup = "rm -rf '" + base + "'";
  CHECK(std::system(cleanup.c_str()) == 0);
}

TEST_CASE("launcher: --no-prefix passes output through unchanged") {
  auto r = run({"--no-prefix", "/bin/sh", "-c", "printf 'a\\n\\nb'"});
  CHECK(r.status == 0);
  CHECK(r.out == "a\n\nb");
}

TEST_CASE("launcher: lines of busy workers never interleave") {
  // Lines longer than a typical read so that pipe reads end mid-line.
  const int per_rank = 2000;
  auto r = run({"--nproc-per-node", "4", "/bin/sh", "-c",
                "p=$(printf '%0300d' 0); i=0; while [ $i -lt " + std::to_string(per_rank) +
                    " ]; do echo \"$RANK $i $p\"; i=$((i+1)); done"});
  CHECK(r.status == 0);
  auto lines = by_rank(r.out);
  CHECK(lines.size() == 4u * per_rank);
  const std::string pad(300, '0');
  for (int rank = 0; rank < 4; ++rank) {
    int expect = 0;
    auto range = lines.equal_range(rank);
    for (auto it = range.first; it != range.second; ++it, ++expect) {
      if (it->second != std::to_string(rank) + " " + std::to_string(expect) + " " + pad) {
        FAIL("rank " << rank << " line " << expect << " garbled: " << it->second.substr(0, 80));
      }
    }
    CHECK(expect == per_rank);
  }
}

TEST_CASE("launcher: workers get /dev/null as stdin") {
  // Our stdin is an open pipe nobody writes: an inherited stdin would hang `cat`.
  auto r = run({"--nproc-per-node", "2", "/bin/sh", "-c", "cat; echo done"});
  CHECK(r.status == 0);
  CHECK(r.out.size() == std::string("[rank 0]: done\n").size() * 2);
}

TEST_CASE("launcher: arguments after the program belong to the program") {
  auto r = run({"/bin/sh", "-c", "echo \"$@\"", "sh", "--nnodes", "5", "--help"});
  CHECK(r.status == 0);
  CHECK(r.out == "[rank 0]: --nnodes 5 --help\n");
}

TEST_CASE("launcher: a failing worker stops the others and sets the exit status") {
  auto r = run({"--nproc-per-node", "3", "/bin/sh", "-c",
                "if [ $RANK = 1 ]; then echo last words >&2; exit 3; fi; sleep 60"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 3);
  CHECK(r.seconds < 30);  // hang guard: the sleepers were stopped, not waited for
  CHECK(contains(r.err, "[rank 1]: last words\n"));
  CHECK(contains(r.err, "cclite-run: rank 1 (host "));
  CHECK(contains(r.err, "exited with status 3; stopping the other 2 workers\n"));
  // Its own output comes before the verdict.
  CHECK(r.err.find("last words") < r.err.find("exited with status"));
}

TEST_CASE("launcher: a worker killed by a signal") {
  auto r = run({"--nproc-per-node", "2", "/bin/sh", "-c",
                "if [ $RANK = 0 ]; then ulimit -c 0; kill -SEGV $$; fi; sleep 60"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 128 + SIGSEGV);
  CHECK(r.seconds < 30);
  CHECK(contains(r.err, "rank 0 (host "));
  CHECK(contains(r.err, "killed by signal SIGSEGV"));
  CHECK(contains(r.err, "stopping the other 1 worker\n"));
}

TEST_CASE("launcher: a worker's children are stopped with it") {
  char dir_tmpl[] = "/tmp/cclite-launcher-XXXXXX";
  REQUIRE(::mkdtemp(dir_tmpl) != nullptr);
  std::string pid_file = std::string(dir_tmpl) + "/grandchild.pid";
  // Rank 1 starts a grandchild (its own pipes closed, so only the process
  // group can reach it), records its pid and fails.
  auto r = run({"--nproc-per-node", "2", "/bin/sh", "-c",
                "if [ $RANK = 1 ]; then sleep 60 >/dev/null 2>&1 & echo $! > " + pid_file +
                    "; sleep 0.3; exit 1; fi; sleep 60"});
  CHECK(r.status == 1);
  std::ifstream in(pid_file);
  pid_t grandchild = 0;
  in >> grandchild;
  REQUIRE(grandchild > 0);
  // It got SIGTERM with its group (allow a moment for delivery).
  auto until = clock_type::now() + 10s;
  while (process_alive(grandchild) && clock_type::now() < until) std::this_thread::sleep_for(20ms);
  CHECK_FALSE(process_alive(grandchild));
  std::remove(pid_file.c_str());
  ::rmdir(dir_tmpl);
}

TEST_CASE("launcher: workers that ignore SIGTERM get SIGKILL after the grace period") {
  auto r = run({"--nproc-per-node", "2", "/bin/sh", "-c",
                "if [ $RANK = 0 ]; then sleep 0.3; exit 2; fi; trap '' TERM; sleep 60"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 2);
  CHECK(r.seconds < 40);  // 5 s grace + margin
  CHECK(contains(r.err, "rank 1 still running 5 s after SIGTERM; sending SIGKILL"));
}

TEST_CASE("launcher: SIGTERM is forwarded to every worker") {
  // Workers loop for at most 30 s, so that a failed test leaves nothing behind.
  launcher l({"--nproc-per-node", "2", "/bin/sh", "-c",
              "trap 'echo rank $RANK got TERM; exit 0' TERM; echo ready; "
              "i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"});
  REQUIRE(l.wait_for_stdout("ready", 2, 30s));
  l.send(SIGTERM);
  auto r = l.finish();
  INFO("stderr: " << r.err);
  CHECK(r.status == 128 + SIGTERM);
  CHECK(contains(r.out, "[rank 0]: rank 0 got TERM\n"));
  CHECK(contains(r.out, "[rank 1]: rank 1 got TERM\n"));
  CHECK(contains(r.err, "cclite-run: received SIGTERM; forwarding it to 2 workers"));
}

TEST_CASE("launcher: SIGINT is forwarded too") {
  launcher l({"--nproc-per-node", "2", "/bin/sh", "-c",
              "trap 'echo got INT; exit 5' INT; echo ready; "
              "i=0; while [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"});
  REQUIRE(l.wait_for_stdout("ready", 2, 30s));
  l.send(SIGINT);
  auto r = l.finish();
  CHECK(r.status == 128 + SIGINT);  // our own signal decides, not the workers' reaction
  CHECK(contains(r.out, "[rank 0]: got INT\n"));
  CHECK(contains(r.out, "[rank 1]: got INT\n"));
}

TEST_CASE("launcher: --timeout stops the job with status 124") {
  auto r = run({"--timeout", "0.5", "--nproc-per-node", "2", "/bin/sh", "-c", "sleep 60"});
  CHECK(r.status == 124);
  CHECK(r.seconds < 30);
  CHECK(contains(r.err, "--timeout 0.5 s"));
}

TEST_CASE("launcher: a missing program is 127 with one line") {
  auto r = run({"--nproc-per-node", "3", "cclite-no-such-program"});
  CHECK(r.status == 127);
  CHECK(r.err ==
        "cclite-run: cannot execute 'cclite-no-such-program': No such file or directory\n");
  CHECK(r.out.empty());
}

TEST_CASE("launcher: usage errors exit 2 with a hint; --help exits 0") {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--bogus", "/bin/true"},
           {"--nproc-per-node", "x", "/bin/true"},
           {"--nproc-per-node", "2"},
           {},
       }) {
    auto r = run(args);
    INFO("stderr: " << r.err);
    CHECK(r.status == 2);
    auto lines = lines_of(r.err);
    REQUIRE(lines.size() == 2);
    CHECK(lines[0].rfind("cclite-run: ", 0) == 0);
    CHECK(contains(lines[1], "--help"));
  }

  auto multi = run({"--nnodes", "2", "--nproc-per-node", "2", "/bin/true"});
  CHECK(multi.status == 2);
  CHECK(contains(multi.err, "--rdzv-endpoint"));

  auto help = run({"--help"});
  CHECK(help.status == 0);
  CHECK(contains(help.out, "usage: cclite-run"));
  CHECK(contains(help.out, "--nproc-per-node"));
  CHECK(contains(help.out, "examples:"));
}

// ---- several agents on this machine: the nodes' rendezvous -------------------------
//
// Agents on one machine meet at 127.0.0.1 exactly as agents on several
// machines meet at node0 (tests/netns/ does that with real namespaces, as
// root): the first to bind the port hosts the store.

namespace {

// 0 if a socket can bind 127.0.0.1:port now, else bind's errno.
int bind_error(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int e = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  ::close(fd);
  return e;
}

// A port nobody listens on, outside the kernel's ephemeral range
// (tools/run/posix.hpp says why: a port bind(0) handed out went to a test
// running beside this one in CI, and both agents of a job timed out).
std::string free_port() {
  std::string err;
  const int p = cclite::run::find_free_port("127.0.0.1", err);
  REQUIRE_MESSAGE(p > 0, err);
  return std::to_string(p);
}

std::vector<std::string> agent_args(const std::string& port, const std::string& id,
                                    std::vector<std::string> rest) {
  std::vector<std::string> a{"--nnodes",   "2",  "--nproc-per-node", "2",
                             "--rdzv-id",  id,   "--rdzv-endpoint",  "127.0.0.1:" + port,
                             "--rdzv-timeout", "60", "--node-timeout", "3"};
  a.insert(a.end(), rest.begin(), rest.end());
  return a;
}

/// True once something listens on 127.0.0.1:port (bind fails with EADDRINUSE).
bool port_taken(const std::string& port) { return bind_error(std::stoi(port)) == EADDRINUSE; }

}  // namespace

TEST_CASE("agents: two nodes meet without --node-rank and number the ranks") {
  const std::string port = free_port();
  auto args = agent_args(port, "j1",
                         {"/bin/sh", "-c",
                          "echo $RANK $WORLD_SIZE $LOCAL_RANK $GROUP_RANK $GROUP_WORLD_SIZE "
                          "$MASTER_ADDR $MASTER_PORT ${#CCLITE_RDZV_TOKEN}"});
  launcher a(args), b(args);
  auto ra = a.finish(), rb = b.finish();
  INFO("a: " << ra.err << "\nb: " << rb.err);
  REQUIRE(ra.status == 0);
  REQUIRE(rb.status == 0);
  auto la = by_rank(ra.out), lb = by_rank(rb.out);
  REQUIRE(la.size() == 2);
  REQUIRE(lb.size() == 2);
  // One agent is node 0 (ranks 0, 1), the other node 1 (ranks 2, 3); same master for all.
  auto& node0 = la.count(0) ? la : lb;
  auto& node1 = la.count(0) ? lb : la;
  REQUIRE(node0.count(1) == 1);
  REQUIRE(node1.count(2) == 1);
  REQUIRE(node1.count(3) == 1);
  std::istringstream in(node0.find(0)->second);
  std::string rank, world, local, group, groups, addr, mport, toklen;
  in >> rank >> world >> local >> group >> groups >> addr >> mport >> toklen;
  CHECK(world == "4");
  CHECK(group == "0");
  CHECK(groups == "2");
  CHECK(addr == "127.0.0.1");
  CHECK(mport != port);  // the workers' store is not the agents'
  CHECK(toklen == "32");  // a job token derived from --rdzv-id
  const std::string tail = " 127.0.0.1 " + mport + " 32";
  CHECK(node0.find(1)->second == "1 4 1 0 2" + tail);
  CHECK(node1.find(2)->second == "2 4 0 1 2" + tail);
  CHECK(node1.find(3)->second == "3 4 1 1 2" + tail);
}

TEST_CASE("agents: under srun two nodes meet with neither --nnodes nor --rdzv-endpoint") {
  const std::string port = free_port();
  // slurmstepd's variables for `srun --nodes 2 --ntasks-per-node 1` on this host
  // (MASTER_PORT: a free port rather than the one derived from the job id).
  auto srun_env = [&](int node) {
    return std::vector<std::string>{"SLURM_STEP_NODELIST=localhost", "SLURM_JOB_ID=77", "SLURM_STEP_ID=0",
                                    "SLURM_STEP_NUM_NODES=2", "SLURM_STEP_NUM_TASKS=2", "SLURM_PROCID=" + std::to_string(node),
                                    "SLURM_NTASKS=2", "SLURM_NODEID=" + std::to_string(node), "MASTER_PORT=" + port,
                                    "CCLITE_DEBUG=INFO"};
  };
  std::vector<std::string> args{"--nproc-per-node", "2", "--rdzv-timeout", "60", "--node-timeout", "3",
                                "/bin/sh", "-c", "echo $RANK $WORLD_SIZE $GROUP_WORLD_SIZE $TORCHELASTIC_RUN_ID"};
  launcher a(args, srun_env(0)), b(args, srun_env(1));
  auto ra = a.finish(), rb = b.finish();
  INFO("a: " << ra.err << "\nb: " << rb.err);
  REQUIRE(ra.status == 0);
  REQUIRE(rb.status == 0);
  auto la = by_rank(ra.out), lb = by_rank(rb.out);
  REQUIRE(la.size() + lb.size() == 4);
  for (const auto* l : {&la, &lb})
    for (const auto& [rank, line] : *l) CHECK(line == std::to_string(rank) + " 4 2 77.0");
  CHECK(ra.err.find("srun: 2 nodes meet at localhost:" + port) != std::string::npos);
}

TEST_CASE("agents: --rdzv-conf is_host=false leaves the store to the other agent") {
  const std::string port = free_port();
  auto args = agent_args(port, "j9", {"/bin/sh", "-c", "echo $RANK"});
  auto client = args;
  client.insert(client.begin(), {"--rdzv-conf", "is_host=false"});
  launcher a(client, {"CCLITE_DEBUG=INFO"});  // first at the endpoint, yet a client
  std::this_thread::sleep_for(300ms);
  CHECK_FALSE(port_taken(port));
  launcher b(args, {"CCLITE_DEBUG=INFO"});
  auto ra = a.finish(90s), rb = b.finish(90s);
  INFO("a: " << ra.err << "\nb: " << rb.err);
  CHECK(ra.status == 0);
  CHECK(rb.status == 0);
  CHECK_FALSE(contains(ra.err, "hosting the rendezvous store"));
  CHECK(contains(rb.err, "hosting the rendezvous store"));
  CHECK(contains(rb.err, "node 0 of 2"));  // the store's host is node 0
}

TEST_CASE("agents: an agent of another --rdzv-id is refused by name") {
  const std::string port = free_port();
  launcher host(agent_args(port, "job-a", {"/bin/sh", "-c", "sleep 30"}));
  for (int i = 0; i < 600 && !port_taken(port); ++i) std::this_thread::sleep_for(50ms);  // it hosts
  auto other = run(agent_args(port, "job-b", {"/bin/true"}));
  INFO("stderr: " << other.err);
  CHECK(other.status == 1);
  CHECK(contains(other.err, "belongs to job 'job-a' but this agent was started with --rdzv-id job-b"));
  host.send(SIGTERM);
  host.finish();
}

TEST_CASE("agents: a failed worker stops every node with its exit code") {
  const std::string port = free_port();
  auto args = agent_args(port, "j3", {"/bin/sh", "-c", "sleep 1; [ $RANK = 3 ] && exit 7; sleep 60"});
  launcher a(args), b(args);
  auto ra = a.finish(90s), rb = b.finish(90s);
  INFO("a: " << ra.err << "\nb: " << rb.err);
  CHECK(ra.status == 7);
  CHECK(rb.status == 7);
  // Both name the failed rank and its host.
  CHECK(contains(ra.err, "rank 3 (host "));
  CHECK(contains(rb.err, "rank 3 (host "));
  CHECK(contains(ra.err + rb.err, "exited with status 7"));
}

TEST_CASE("agents: a node whose agent is killed is declared lost on the others") {
  const std::string port = free_port();
  auto args = agent_args(port, "j4", {"/bin/sh", "-c", "echo up; sleep 60"});
  launcher a(args), b(args);
  REQUIRE(a.wait_for_stdout("up", 2, 60s));
  REQUIRE(b.wait_for_stdout("up", 2, 60s));
  b.send(SIGKILL);  // no goodbye: only the missing heartbeat tells
  auto ra = a.finish(90s);
  INFO("a: " << ra.err);
  CHECK(ra.status == 1);
  // b was node 1 (a heartbeat stops) or the store's host (the store goes away).
  CHECK((contains(ra.err, "is lost: its cclite-run agent sent no heartbeat") ||
         contains(ra.err, "lost the rendezvous store")));
  b.finish();
}

TEST_CASE("restarts: one node starts its workers over until they succeed") {
  auto r = run({"--nproc-per-node", "2", "--max-restarts", "2", "/bin/sh", "-c",
                "echo try $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS; "
                "[ $TORCHELASTIC_RESTART_COUNT -lt 2 ] && [ $RANK = 1 ] && exit 3; exit 0"});
  INFO("stderr: " << r.err);
  CHECK(r.status == 0);
  CHECK(contains(r.err, "restarting the workers (restart 1 of 2)"));
  CHECK(contains(r.err, "restarting the workers (restart 2 of 2)"));
  CHECK(contains(r.out, "[rank 0]: try 2 of 2"));

  auto out = run({"--nproc-per-node", "2", "--max-restarts", "1", "/bin/sh", "-c", "exit 4"});
  CHECK(out.status == 4);  // restarts used up: the last failure's status
  CHECK(contains(out.err, "restart 1 of 1"));
}

TEST_CASE("restarts: two nodes meet again and restart together") {
  const std::string port = free_port();
  auto args = agent_args(port, "j5",
                         {"--max-restarts", "1", "/bin/sh", "-c",
                          "sleep 0.5; echo try $TORCHELASTIC_RESTART_COUNT; "
                          "[ $TORCHELASTIC_RESTART_COUNT = 0 ] && [ $RANK = 3 ] && exit 5; exit 0"});
  launcher a(args), b(args);
  auto ra = a.finish(90s), rb = b.finish(90s);
  INFO("a: " << ra.err << "\nb: " << rb.err);
  CHECK(ra.status == 0);
  CHECK(rb.status == 0);
  for (const auto* r : {&ra, &rb}) {
    CHECK(contains(r->err, "restarting the workers (restart 1 of 1)"));
    CHECK(contains(r->out, "try 1"));
  }
}

TEST_CASE("elastic: --nnodes 1:2 goes on with the node that is left") {
  const std::string port = free_port();
  std::vector<std::string> args{"--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-id", "j6",
                                "--rdzv-endpoint", "127.0.0.1:" + port, "--rdzv-timeout", "60",
                                "--node-timeout", "3", "--rdzv-last-call", "1", "--max-restarts", "1",
                                "/bin/sh", "-c",
                                "echo try $TORCHELASTIC_RESTART_COUNT world $WORLD_SIZE nodes $GROUP_WORLD_SIZE; "
                                "[ $TORCHELASTIC_RESTART_COUNT = 0 ] && sleep 60; exit 0"};
  launcher a(args);
  for (int i = 0; i < 600 && !port_taken(port); ++i) std::this_thread::sleep_for(50ms);  // a hosts
  launcher b(args);
  REQUIRE(a.wait_for_stdout("world 4 nodes 2", 2, 60s));
  REQUIRE(b.wait_for_stdout("world 4 nodes 2", 2, 60s));
  b.send(SIGKILL);
  auto ra = a.finish(90s);
  INFO("a: " << ra.err);
  CHECK(ra.status == 0);
  CHECK(contains(ra.err, "is lost"));
  CHECK(contains(ra.out, "try 1 world 2 nodes 1"));
  b.finish();
}

TEST_CASE("elastic: a node that arrives while the job runs is taken in (scale-up)") {
  const std::string port = free_port();
  // No --max-restarts: a membership change is not a restart (torchrun).
  std::vector<std::string> args{"--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-id", "j8",
                                "--rdzv-endpoint", "127.0.0.1:" + port, "--rdzv-timeout", "60",
                                "--node-timeout", "3", "--rdzv-last-call", "1", "/bin/sh", "-c",
                                "echo try $TORCHELASTIC_RESTART_COUNT world $WORLD_SIZE nodes $GROUP_WORLD_SIZE; "
                                "[ $WORLD_SIZE = 2 ] && exec sleep 60; exit 0"};
  launcher a(args);
  REQUIRE(a.wait_for_stdout("world 2 nodes 1", 2, 60s));  // the round closed with a alone
  launcher b(args);
  auto ra = a.finish(90s), rb = b.finish(90s);
  INFO("a: " << ra.err << "\nb: " << rb.err);
  CHECK(ra.status == 0);
  CHECK(rb.status == 0);
  CHECK(contains(ra.err, "a node is waiting to join (the job has 1 of at most 2 nodes)"));
  CHECK(contains(ra.err, "not counted as a restart"));
  // Both nodes' workers ran in the larger round, still at restart 0.
  CHECK(by_rank(ra.out).size() == 4);  // 2 workers alone, then 2 in the 2-node round
  CHECK(by_rank(rb.out).size() == 2);
  CHECK(contains(ra.out, "try 0 world 4 nodes 2"));
  CHECK(contains(rb.out, "try 0 world 4 nodes 2"));
  CHECK_FALSE(contains(rb.out, "world 2"));  // b never ran in a's first round
  CHECK_FALSE(contains(ra.err + rb.err, "restart 1"));
}

TEST_CASE("elastic: an agent for a job that already has --nnodes MAX nodes is refused; the job goes on") {
  const std::string port = free_port();
  std::vector<std::string> args{"--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-id", "j10",
                                "--rdzv-endpoint", "127.0.0.1:" + port, "--rdzv-timeout", "60",
                                "--node-timeout", "3", "--rdzv-last-call", "1", "/bin/sh", "-c",
                                "echo world $WORLD_SIZE; sleep 3"};
  launcher a(args);
  for (int i = 0; i < 600 && !port_taken(port); ++i) std::this_thread::sleep_for(50ms);  // a hosts
  launcher b(args);
  REQUIRE(a.wait_for_stdout("world 2", 1, 60s));  // the round closed with both: MAX
  auto extra = run(args);
  INFO("extra: " << extra.err);
  CHECK(extra.status == 1);
  CHECK(contains(extra.err, "already has its 2 nodes"));
  auto ra = a.finish(60s), rb = b.finish(60s);
  INFO("a: " << ra.err << "\nb: " << rb.err);
  CHECK(ra.status == 0);
  CHECK(rb.status == 0);
  CHECK_FALSE(contains(ra.err + rb.err, "waiting to join"));
}

TEST_CASE("restarts: a signal cancels the job on every node instead of restarting it") {
  const std::string port = free_port();
  auto args = agent_args(port, "j7", {"--max-restarts", "3", "/bin/sh", "-c", "echo up; sleep 60"});
  launcher a(args), b(args);
  REQUIRE(a.wait_for_stdout("up", 2, 60s));
  REQUIRE(b.wait_for_stdout("up", 2, 60s));
  b.send(SIGTERM);  // a scheduler cancelling the job
  auto rb = b.finish(60s), ra = a.finish(60s);
  INFO("a: " << ra.err << "\nb: " << rb.err);
  CHECK(rb.status == 128 + SIGTERM);
  CHECK(ra.status == 128 + SIGTERM);  // the first failure's status, on every node
  CHECK(contains(ra.err, "received SIGTERM"));
  CHECK_FALSE(contains(ra.err + rb.err, "restarting"));
}
