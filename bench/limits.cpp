// machine_limits: what this machine allows, measured in the same run as the perf
// programs, so that their busbw can be read as a fraction of a limit (DESIGN.md:
// every performance claim sits beside a peer and the machine's limit).
//
//   build/bin/machine_limits [-s bytes] [-n reps] [-t tests] [-J file.json]
//
//   -s  buffer size per array / per direction (default 64M; K, M, G suffixes)
//   -n  timed repetitions per test; the median is reported with min and max (default 9)
//   -t  comma-separated subset of: memcpy,memcpy_x2,add,tcp_bidir,tcp_uni,fault_anon,
//       fault_shm (default all)
//   -J  append one JSON object per test to this file
//   -a  tcp tests: the IPv4 address the first process listens on (default 127.0.0.1)
//   -N  tcp tests: a network namespace file (/var/run/netns/NAME) the second process
//       enters before it connects, so the stream crosses a simulated link (root):
//         ip netns exec A machine_limits -t tcp_bidir -a <A's address> -N /var/run/netns/B
//
// Tests (every buffer is touched before timing; one untimed warm-up pass each):
//   memcpy     one thread, memcpy(dst, src, s). GB/s = s / time: bytes *copied*; the
//              memory traffic is twice that (one read + one write per byte, plus the
//              write-allocate read of dst on most CPUs).
//   memcpy_x2  the same in two processes at once (fork), as two ranks of a node do;
//              GB/s per process (median over both processes' repetitions).
//   add        c[i] = a[i] + b[i] on float arrays of s bytes each, one thread.
//              GB/s = 3 * s / time: two arrays read + one written (write-allocate
//              not counted), the STREAM "Add" convention.
//   tcp_bidir  two processes (fork) over one loopback TCP connection, blocking
//              sockets, each sending s bytes to the other at the same time (a sender
//              thread and a receiving thread per process). Per-direction GB/s =
//              s / the slower receiver's time: what a 2-rank ring over TCP can reach.
//              The bytes are sent from and received into a 4 MiB window (cycled),
//              as a transport's staging ring is: with 64 MiB cache-cold buffers
//              the four kernel copies become DRAM-bound and the figure fell to
//              half what cclite's ring reached over the same loopback.
//   tcp_uni    the same connection, one direction only: s / the receiver's time.
//   fault_anon first write to s bytes of freshly mmapped anonymous memory: page faults
//              plus zeroing (a malloc/free of >= 32 MiB per call pays this every call).
//   fault_shm  first write to a POSIX shm segment mapped MAP_SHARED | MAP_POPULATE
//              after posix_fallocate (as a shared-memory FIFO is set up): populate
//              maps shared pages read-only, so the first write still faults per page.
//              Both print microseconds per 4 KiB page beside GB/s.
// GB/s means 1e9 bytes per second (as nccl-tests' algbw/busbw); MB/s = 1e6.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/perf_args.hpp"  // parse_size (64M, 1G)

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "machine_limits: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

// Page-aligned buffer, touched (every page written) before any timing.
struct buffer {
  explicit buffer(std::size_t n, int fill) : n_(n) {
    p_ = static_cast<char*>(std::aligned_alloc(4096, (n + 4095) / 4096 * 4096));
    if (!p_) die("aligned_alloc");
    std::memset(p_, fill, n);
  }
  ~buffer() { std::free(p_); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
  char* data() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  char* p_;
  std::size_t n_;
};

// Keeps the compiler from dropping a store it cannot see being read.
inline void clobber(void* p) { asm volatile("" : : "r"(p) : "memory"); }

struct stats {
  double median = 0, min = 0, max = 0;
};

stats summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  stats s;
  if (v.empty()) return s;
  s.min = v.front();
  s.max = v.back();
  std::size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

// ---- memory -------------------------------------------------------------------

std::vector<double> run_memcpy(std::size_t bytes, int reps) {
  buffer src(bytes, 1), dst(bytes, 2);
  std::memcpy(dst.data(), src.data(), bytes);  // warm-up
  clobber(dst.data());
  std::vector<double> rate;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    std::memcpy(dst.data(), src.data(), bytes);
    clobber(dst.data());
    rate.push_back(bytes / (now() - t0) / 1e9);
  }
  return rate;
}

__attribute__((noinline)) void add(float* __restrict c, const float* __restrict a,
                                   const float* __restrict b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

std::vector<double> run_add(std::size_t bytes, int reps) {
  const std::size_t n = bytes / sizeof(float);
  buffer a(n * sizeof(float), 0), b(n * sizeof(float), 0), c(n * sizeof(float), 0);
  float* fa = reinterpret_cast<float*>(a.data());
  float* fb = reinterpret_cast<float*>(b.data());
  float* fc = reinterpret_cast<float*>(c.data());
  for (std::size_t i = 0; i < n; ++i) fa[i] = float(i % 7), fb[i] = float(i % 5);
  add(fc, fa, fb, n);  // warm-up
  std::vector<double> rate;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    add(fc, fa, fb, n);
    clobber(fc);
    rate.push_back(3.0 * n * sizeof(float) / (now() - t0) / 1e9);
  }
  if (fc[n / 2] != fa[n / 2] + fb[n / 2]) {
    std::fprintf(stderr, "machine_limits: add produced a wrong value\n");
    std::exit(1);
  }
  return rate;
}

// First writes to fresh mappings: anonymous, or shm set up like a FIFO segment.
std::vector<double> run_fault(std::size_t bytes, int reps, bool shm) {
  std::vector<double> rate;
  for (int r = -1; r < reps; ++r) {  // r == -1: warm-up
    int fd = -1;
    int flags = MAP_PRIVATE | MAP_ANONYMOUS;
    if (shm) {
      char name[64];
      std::snprintf(name, sizeof name, "/cclite-limits-%d", static_cast<int>(::getpid()));
      fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) die("shm_open");
      ::shm_unlink(name);
      if (::ftruncate(fd, static_cast<off_t>(bytes))) die("ftruncate");
      if (int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes))) {
        errno = e;
        die("posix_fallocate (is /dev/shm big enough?)");
      }
      flags = MAP_SHARED;
#ifdef MAP_POPULATE
      flags |= MAP_POPULATE;
#endif
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p == MAP_FAILED) die("mmap");
    double t0 = now();
    std::memset(p, 1, bytes);
    clobber(p);
    double t = now() - t0;
    ::munmap(p, bytes);
    if (fd >= 0) ::close(fd);
    if (r >= 0) rate.push_back(bytes / t / 1e9);
  }
  return rate;
}

// ---- processes ----------------------------------------------------------------

void write_all(int fd, const void* p, std::size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n) {
    ssize_t k = ::write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("write");
    c += k, n -= static_cast<std::size_t>(k);
  }
}

void read_all(int fd, void* p, std::size_t n) {
  char* c = static_cast<char*>(p);
  while (n) {
    ssize_t k = ::read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) {
      std::fprintf(stderr, "machine_limits: peer process closed early\n");
      std::exit(1);
    }
    if (k < 0) die("read");
    c += k, n -= static_cast<std::size_t>(k);
  }
}

void send_all(int fd, const char* p, std::size_t n) {
  while (n) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("send");
    p += k, n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, char* p, std::size_t n) {
  while (n) {
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) {
      std::fprintf(stderr, "machine_limits: tcp peer closed early\n");
      std::exit(1);
    }
    if (k < 0) die("recv");
    p += k, n -= static_cast<std::size_t>(k);
  }
}

int wait_child(pid_t pid) {
  int st = 0;
  while (::waitpid(pid, &st, 0) < 0)
    if (errno != EINTR) die("waitpid");
  return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

// Two processes run memcpy at the same time; returns both processes' rates.
std::vector<double> run_memcpy_x2(std::size_t bytes, int reps) {
  int ready[2], go[2], out[2];
  if (::pipe(ready) || ::pipe(go) || ::pipe(out)) die("pipe");
  pid_t kids[2];
  for (int k = 0; k < 2; ++k) {
    kids[k] = ::fork();
    if (kids[k] < 0) die("fork");
    if (kids[k] == 0) {
      buffer src(bytes, 1), dst(bytes, 2);
      std::memcpy(dst.data(), src.data(), bytes);
      char c = 'r';
      write_all(ready[1], &c, 1);
      read_all(go[0], &c, 1);  // both start together
      std::vector<double> rate;
      for (int r = 0; r < reps; ++r) {
        double t0 = now();
        std::memcpy(dst.data(), src.data(), bytes);
        clobber(dst.data());
        rate.push_back(bytes / (now() - t0) / 1e9);
      }
      write_all(out[1], rate.data(), rate.size() * sizeof(double));
      std::_Exit(0);
    }
  }
  char c[2];
  read_all(ready[0], c, 2);
  write_all(go[1], "gg", 2);
  std::vector<double> all(2 * static_cast<std::size_t>(reps));
  read_all(out[0], all.data(), all.size() * sizeof(double));
  for (pid_t k : kids)
    if (wait_child(k) != 0) {
      std::fprintf(stderr, "machine_limits: memcpy_x2 child failed\n");
      std::exit(1);
    }
  for (int fd : {ready[0], ready[1], go[0], go[1], out[0], out[1]}) ::close(fd);
  return all;
}

// ---- tcp ----------------------------------------------------------------------

// One rep on an established connection. `sends`/`recvs`: this side's role.
// Returns this side's receive time (0 when it receives nothing). The go byte
// from the parent aligns both sides to within one loopback latency.
// `bytes` each way, from/into the buffers cycled as windows of their size.
double tcp_rep(int fd, bool parent, bool sends, bool recvs, const buffer& out, const buffer& in,
               std::size_t bytes) {
  char g = 'g';
  if (parent) send_all(fd, &g, 1);
  else recv_all(fd, &g, 1);
  double t0 = now();
  std::thread tx;
  if (sends) tx = std::thread([&] {
    for (std::size_t done = 0; done < bytes; done += out.size()) send_all(fd, out.data(), std::min(out.size(), bytes - done));
  });
  double t = 0;
  if (recvs) {
    for (std::size_t done = 0; done < bytes; done += in.size()) recv_all(fd, in.data(), std::min(in.size(), bytes - done));
    t = now() - t0;
  }
  if (tx.joinable()) tx.join();
  // Both sides finish the rep before the next go byte (it must not overtake data).
  char d = 'd';
  send_all(fd, &d, 1);
  recv_all(fd, &d, 1);
  return t;
}

// Per-direction rates (GB/s), one per rep.
// `listen_addr`: dotted IPv4 (empty: loopback); `child_netns`: namespace file the
// connecting process enters first (empty: stay).
std::vector<double> run_tcp(std::size_t bytes, int reps, bool bidir, const std::string& listen_addr,
                            const std::string& child_netns) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) die("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!listen_addr.empty() && ::inet_pton(AF_INET, listen_addr.c_str(), &addr.sin_addr) != 1) {
    std::fprintf(stderr, "machine_limits: -a %s is not an IPv4 address\n", listen_addr.c_str());
    std::exit(2);
  }
  addr.sin_port = 0;
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr)) die("bind");
  if (::listen(lfd, 1)) die("listen");
  socklen_t len = sizeof addr;
  if (::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len)) die("getsockname");
  int times[2];
  if (::pipe(times)) die("pipe");

  pid_t pid = ::fork();
  if (pid < 0) die("fork");
  const bool parent = pid != 0;
  int fd = -1;
  if (parent) {
    fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) die("accept");
  } else {
    if (!child_netns.empty()) {  // the child is single-threaded here: setns is allowed
      int ns = ::open(child_netns.c_str(), O_RDONLY | O_CLOEXEC);
      if (ns < 0 || ::setns(ns, CLONE_NEWNET) != 0) die(child_netns.c_str());
      ::close(ns);
    }
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) die("socket");
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr)) die("connect");
  }
  ::close(lfd);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // the small sync bytes
  const std::size_t window = std::min<std::size_t>(bytes, 4u << 20);
  buffer out(window, parent ? 3 : 4), in(window, 0);
  // Parent sends in both modes; the child sends only when bidirectional.
  const bool sends = parent || bidir, recvs = !parent || bidir;
  std::vector<double> rate;
  for (int r = -1; r < reps; ++r) {  // r == -1: warm-up (slow start, page faults)
    double t = tcp_rep(fd, parent, sends, recvs, out, in, bytes);
    if (!parent) {
      write_all(times[1], &t, sizeof t);
      continue;
    }
    double tc = 0;
    read_all(times[0], &tc, sizeof tc);
    double slowest = std::max(t, tc);
    if (r >= 0) rate.push_back(bytes / slowest / 1e9);
  }
  ::close(fd);
  if (!parent) std::_Exit(0);
  ::close(times[0]);
  ::close(times[1]);
  if (wait_child(pid) != 0) {
    std::fprintf(stderr, "machine_limits: tcp child failed\n");
    std::exit(1);
  }
  return rate;
}

struct test {
  const char* name;
  const char* counts;  // what the GB/s figure counts
};

const test tests[] = {
    {"memcpy", "bytes copied/s, 1 thread (traffic = 2x: read+write)"},
    {"memcpy_x2", "bytes copied/s per process, 2 processes at once"},
    {"add", "3 arrays/s: c=a+b float, 2 read + 1 written, 1 thread"},
    {"tcp_bidir", "per direction, both directions at once, loopback"},
    {"tcp_uni", "one direction only, loopback"},
    {"fault_anon", "first write to fresh anonymous memory"},
    {"fault_shm", "first write to shm mapped with MAP_POPULATE"},
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = 64u << 20;
  int reps = 9;
  std::string only, json, listen_addr, child_netns;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (f == "-h" || f == "--help" || !v) {
      std::fprintf(stderr,
                   "usage: machine_limits [-s bytes] [-n reps] [-t memcpy,memcpy_x2,add,tcp_bidir,"
                   "tcp_uni,fault_anon,fault_shm] [-J file.json] [-a listen-ipv4] [-N netns-file]\n");
      return f == "-h" || f == "--help" ? 0 : 2;
    }
    ++i;
    if (f == "-s") {
      if (!bench::parse_size(v, bytes) || bytes < 4096) { std::fprintf(stderr, "machine_limits: bad -s\n"); return 2; }
    } else if (f == "-n") {
      reps = std::atoi(v);
      if (reps < 1) { std::fprintf(stderr, "machine_limits: -n must be >= 1\n"); return 2; }
    } else if (f == "-t") {
      only = std::string(",") + v + ",";
    } else if (f == "-J") {
      json = v;
    } else if (f == "-a") {
      listen_addr = v;
    } else if (f == "-N") {
      child_netns = v;
    } else {
      std::fprintf(stderr, "machine_limits: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  FILE* js = json.empty() ? nullptr : std::fopen(json.c_str(), "a");
  if (!json.empty() && !js) die(json.c_str());

  char host[256] = "?";
  ::gethostname(host, sizeof host - 1);
  std::printf("# machine_limits: %s, %ld CPUs online, %zu B buffers, median of %d (min..max); tcp: %s%s%s\n",
              host, ::sysconf(_SC_NPROCESSORS_ONLN), bytes, reps,
              listen_addr.empty() ? "loopback" : listen_addr.c_str(), child_netns.empty() ? "" : ", peer in ",
              child_netns.c_str());
  std::printf("# %-10s %9s %9s %9s %10s   %s\n", "test", "GB/s", "min", "max", "MB/s", "counts");
  std::fflush(stdout);
  for (const test& t : tests) {
    if (!only.empty() && only.find(std::string(",") + t.name + ",") == std::string::npos) continue;
    std::string n = t.name;
    std::vector<double> r = n == "memcpy"      ? run_memcpy(bytes, reps)
                            : n == "memcpy_x2" ? run_memcpy_x2(bytes, reps)
                            : n == "add"       ? run_add(bytes, reps)
                            : n == "tcp_bidir" ? run_tcp(bytes, reps, true, listen_addr, child_netns)
                            : n == "tcp_uni"   ? run_tcp(bytes, reps, false, listen_addr, child_netns)
                            : n == "fault_anon" ? run_fault(bytes, reps, false)
                                                : run_fault(bytes, reps, true);
    stats s = summarize(r);
    std::string counts = t.counts;
    if (n.compare(0, 4, "tcp_") == 0 && !listen_addr.empty()) {
      counts.replace(counts.rfind("loopback"), 8, "to " + listen_addr + (child_netns.empty() ? "" : " from " + child_netns));
    }
    if (n.compare(0, 6, "fault_") == 0 && s.median > 0) {
      char us[64];
      std::snprintf(us, sizeof us, " (%.2f us per 4 KiB page)", 4096 / (s.median * 1e3));
      counts += us;
    }
    std::printf("  %-10s %9.2f %9.2f %9.2f %10.0f   %s\n", t.name, s.median, s.min, s.max,
                s.median * 1e3, counts.c_str());
    std::fflush(stdout);
    if (js)
      std::fprintf(js,
                   "{\"impl\":\"machine\",\"test\":\"%s\",\"bytes\":%zu,\"reps\":%d,\"gbps\":%.4f,"
                   "\"gbps_min\":%.4f,\"gbps_max\":%.4f,\"counts\":\"%s\"}\n",
                   t.name, bytes, reps, s.median, s.min, s.max, counts.c_str());
  }
  if (js) std::fclose(js);
  return 0;
}
