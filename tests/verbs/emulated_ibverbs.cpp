// emulated_ibverbs.cpp - a stand-in for libibverbs, so that the verbs
// transport's data path (QP set-up, RDMA WRITE WITH IMMEDIATE into the peer's
// FIFO, receive requests, credits, completion channels) runs between real
// processes on a machine without an RDMA NIC. Linked instead of libibverbs into
// verbs_emulated_test (tests/verbs/verbs.cmake); not a model of a NIC's speed.
//
// The device: one HCA "emu_0", port 1, InfiniBand link layer, active, LID 1,
// MTU 4096, one GID. Everything the transport calls is here; the calls that
// verbs.h inlines through the context's ops (post_send, post_recv, poll_cq,
// req_notify_cq) are filled in the context.
//
// How a write travels (what a NIC does, done by the sender's process):
//  - every QP has a file in CCLITE_EMULATED_IBV_DIR (default /dev/shm), named
//    by its QP number, holding its owner's pid, the path of the completion
//    channel of its receive CQ and a ring of arriving immediates;
//  - every process has a file listing its memory regions (rkey, range, access);
//  - ibv_post_send(RDMA_WRITE_WITH_IMM) checks the local sge against the
//    sender's regions and the remote range against the peer's (REMOTE_WRITE,
//    inside the region: a write outside the peer's FIFO is a remote access
//    error, as on a NIC), copies the bytes into the peer's address space with
//    process_vm_writev, appends (imm, length) to the peer QP's ring, wakes the
//    peer's channel (a FIFO) and completes the send locally;
//  - the peer's ibv_poll_cq matches ring entries with its posted receive
//    requests in order (no request posted: the entry waits, as RNR retries
//    would) and completes them as IBV_WC_RECV_RDMA_WITH_IMM.
// A peer that exited: process_vm_writev fails (ESRCH), or its QP is marked
// destroyed, and the send completes with IBV_WC_RETRY_EXC_ERR, what a NIC
// reports when the far end is gone - and, as on a NIC, only after its retries
// ran out (4.096 us x 2^timeout x (retry_cnt + 1) of the QP's RTS attributes,
// 34 s with cclite's defaults, CCLITE_IB_TIMEOUT shortens it): a rank whose peer finished the last collective
// and exited sees the failed credit return of that collective only later, not
// while it is still finishing the same call.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace {

// ---- shared files -----------------------------------------------------------------

constexpr std::uint32_t ring_entries = 1 << 13;  // arrived, not yet matched immediates per QP
constexpr int max_mrs = 4096;

struct ring_entry {
  std::uint32_t imm;  // as posted (network byte order)
  std::uint32_t len;
};
struct qp_file {
  std::int32_t pid;
  std::atomic<std::uint32_t> alive;  // 0 once destroyed
  char channel[200];                 // FIFO of the receive CQ's channel, "" if none
  alignas(64) std::atomic<std::uint64_t> head;  // written by the remote sender
  alignas(64) std::atomic<std::uint64_t> tail;  // written by the owner
  ring_entry ring[ring_entries];
};
struct mr_entry {
  std::atomic<std::uint32_t> rkey;  // 0: free
  std::uint32_t access;
  std::uint64_t addr, length;
};
struct mr_file {
  mr_entry mr[max_mrs];
};

std::string dir() {
  const char* d = std::getenv("CCLITE_EMULATED_IBV_DIR");
  return d && *d ? d : "/dev/shm";
}
std::string qp_path(std::uint32_t qpn) { return dir() + "/cclite-emuibv-qp-" + std::to_string(qpn); }
std::string mr_path(int pid) { return dir() + "/cclite-emuibv-mr-" + std::to_string(pid); }

template <class T>
T* map_file(const std::string& path, bool create) {
  int fd = ::open(path.c_str(), create ? O_RDWR | O_CREAT | O_EXCL : O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (create && ::ftruncate(fd, sizeof(T)) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* m = ::mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return m == MAP_FAILED ? nullptr : static_cast<T*>(m);
}

std::mutex& lock() {
  static std::mutex m;
  return m;
}

// This process's memory regions, in a file the peers read; made again in a
// forked child (the parent's file is the parent's). Removed when the last
// device context closes.
struct own_state {
  int pid = 0;
  mr_file* mrs = nullptr;
  int contexts = 0;
};
own_state& own() {
  static own_state s;
  if (s.pid != ::getpid()) {
    s = own_state{};
    s.pid = ::getpid();
  }
  return s;
}
mr_file* own_mrs() {
  own_state& s = own();
  if (!s.mrs) {
    const std::string p = mr_path(s.pid);
    ::unlink(p.c_str());  // a pid reused after a crash
    s.mrs = map_file<mr_file>(p, true);
  }
  return s.mrs;
}

// ---- objects ----------------------------------------------------------------------

struct emu_cq;
struct emu_channel {
  ibv_comp_channel ch{};
  std::string path;
  emu_cq* cq = nullptr;  // the CQ it reports (the transport has one per channel)
};
struct emu_qp {
  ibv_qp qp{};
  qp_file* mine = nullptr;    // our ring (the peer writes into it)
  qp_file* remote = nullptr;  // the peer QP's ring, from RTR on
  mr_file* remote_mrs = nullptr;  // the peer process's memory regions
  int remote_wake = -1;       // the peer's channel FIFO, opened for writing
  int remote_pidfd = -1;      // readable once the peer process exited (its QPs died with it)
  std::deque<std::uint64_t> recvs;  // posted receive requests (wr_id)
  bool broken = false;
  std::chrono::nanoseconds retries{std::chrono::milliseconds(540)};  // until retry exceeded (RTS attributes)
};
struct local_completion {
  ibv_wc wc;
  std::chrono::steady_clock::time_point ready;  // not reported before
};
struct emu_cq {
  ibv_cq cq{};
  std::deque<local_completion> done;  // local completions (sends, errors), in order
  std::vector<emu_qp*> qps;    // QPs receiving into this CQ
};

// The peer may have closed its channel already (it destroyed its link):
// writing to a FIFO without a reader raises SIGPIPE, which must not reach the
// program (the trick of blocking it and taking a pending one back).
void wake(int fd) {
  if (fd < 0) return;
  sigset_t pipe, old;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, &old);
  char b = 1;
  if (::write(fd, &b, 1) < 0 && errno == EPIPE) {  // EAGAIN: a wake-up is already pending
    const timespec zero{0, 0};
    while (sigtimedwait(&pipe, nullptr, &zero) > 0) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
}

// [addr, addr + len) lies in the region `key` of `f`, which grants `access`
// (lkey == rkey here).
bool range_ok(const mr_file* f, std::uint32_t key, std::uint64_t addr, std::uint64_t len, std::uint32_t access) {
  if (!f) return false;
  for (auto& e : f->mr)
    if (e.rkey.load() == key)
      return (e.access & access) == access && addr >= e.addr && addr + len <= e.addr + e.length;
  return false;
}

// A process that exited (even one not reaped yet, whose memory may still be
// written) has lost its QPs: the kernel destroys them at exit.
bool exited(int pidfd) {
  if (pidfd < 0) return false;  // no pidfd (kernel < 5.3): process_vm_writev's ESRCH tells
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) > 0;
}

void complete_local(emu_qp* q, std::uint64_t wr_id, ibv_wc_status st, ibv_wc_opcode op, std::uint32_t len) {
  ibv_wc wc{};
  wc.wr_id = wr_id;
  wc.status = st;
  wc.opcode = op;
  wc.byte_len = len;
  wc.qp_num = q->qp.qp_num;
  wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : 0xe;
  auto ready = std::chrono::steady_clock::now();
  if (st == IBV_WC_RETRY_EXC_ERR) ready += q->retries;
  reinterpret_cast<emu_cq*>(q->qp.send_cq)->done.push_back({wc, ready});
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard<std::mutex> g(lock());
  emu_qp* q = reinterpret_cast<emu_qp*>(qp);
  for (; wr; wr = wr->next) {
    if (qp->state != IBV_QPS_RTS || wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM || wr->num_sge > 1) {
      *bad = wr;
      return EINVAL;
    }
    const std::uint32_t len = wr->num_sge ? wr->sg_list[0].length : 0;
    ibv_wc_status st = IBV_WC_SUCCESS;
    if (q->broken) {
      st = IBV_WC_WR_FLUSH_ERR;
    } else if (len && !range_ok(own_mrs(), wr->sg_list[0].lkey, wr->sg_list[0].addr, len, 0)) {
      st = IBV_WC_LOC_PROT_ERR;
    } else if (!q->remote || !q->remote->alive.load() || exited(q->remote_pidfd)) {
      st = IBV_WC_RETRY_EXC_ERR;
    } else if (len && !range_ok(q->remote_mrs, wr->wr.rdma.rkey, wr->wr.rdma.remote_addr, len, IBV_ACCESS_REMOTE_WRITE)) {
      st = IBV_WC_REM_ACCESS_ERR;
    } else {
      if (len) {
        iovec local{reinterpret_cast<void*>(wr->sg_list[0].addr), len};
        iovec far{reinterpret_cast<void*>(wr->wr.rdma.remote_addr), len};
        if (::process_vm_writev(q->remote->pid, &local, 1, &far, 1, 0) != static_cast<ssize_t>(len)) {
          st = IBV_WC_RETRY_EXC_ERR;  // the peer is gone
          if (errno == EPERM)
            std::fprintf(stderr, "emulated ibverbs: process_vm_writev into pid %d not permitted (ptrace "
                         "restrictions: yama ptrace_scope, seccomp, no CAP_SYS_PTRACE?)\n",
                         static_cast<int>(q->remote->pid));
        }
      }
      if (st == IBV_WC_SUCCESS) {
        const std::uint64_t h = q->remote->head.load(std::memory_order_relaxed);
        if (h - q->remote->tail.load(std::memory_order_acquire) >= ring_entries) {
          std::fprintf(stderr, "emulated ibverbs: qp %u: %u writes with immediate not received by pid %d\n",
                       qp->qp_num, ring_entries, static_cast<int>(q->remote->pid));
          st = IBV_WC_RNR_RETRY_EXC_ERR;
        } else {
          q->remote->ring[h % ring_entries] = ring_entry{wr->imm_data, len};
          q->remote->head.store(h + 1, std::memory_order_release);
          wake(q->remote_wake);
        }
      }
    }
    if (st != IBV_WC_SUCCESS) q->broken = true;  // an RC QP goes to the error state
    if (st != IBV_WC_SUCCESS || (wr->send_flags & IBV_SEND_SIGNALED))
      complete_local(q, wr->wr_id, st, IBV_WC_RDMA_WRITE, len);
  }
  return 0;
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard<std::mutex> g(lock());
  emu_qp* q = reinterpret_cast<emu_qp*>(qp);
  for (; wr; wr = wr->next) {
    if (qp->state == IBV_QPS_RESET || qp->state == IBV_QPS_ERR) {
      *bad = wr;
      return EINVAL;
    }
    q->recvs.push_back(wr->wr_id);
  }
  return 0;
}

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard<std::mutex> g(lock());
  emu_cq* c = reinterpret_cast<emu_cq*>(cq);
  int got = 0;
  const auto now = std::chrono::steady_clock::now();
  while (got < n && !c->done.empty() && c->done.front().ready <= now) {
    wc[got++] = c->done.front().wc;
    c->done.pop_front();
  }
  for (emu_qp* q : c->qps) {
    qp_file* f = q->mine;
    std::uint64_t t = f->tail.load(std::memory_order_relaxed);
    while (got < n && !q->recvs.empty() && t != f->head.load(std::memory_order_acquire)) {
      const ring_entry e = f->ring[t % ring_entries];
      ibv_wc& w = wc[got++];
      w = ibv_wc{};
      w.wr_id = q->recvs.front();
      q->recvs.pop_front();
      w.status = IBV_WC_SUCCESS;
      w.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
      w.byte_len = e.len;
      w.imm_data = e.imm;
      w.wc_flags = IBV_WC_WITH_IMM;
      w.qp_num = q->qp.qp_num;
      f->tail.store(++t, std::memory_order_release);
    }
  }
  return got;
}

int req_notify_cq(ibv_cq*, int) { return 0; }  // every arrival writes to the channel anyway

ibv_device emu_device = [] {
  ibv_device d{};
  d.node_type = IBV_NODE_CA;
  d.transport_type = IBV_TRANSPORT_IB;
  std::snprintf(d.name, sizeof d.name, "emu_0");
  std::snprintf(d.dev_name, sizeof d.dev_name, "uverbs_emu0");
  return d;
}();

}  // namespace

extern "C" {

ibv_device** ibv_get_device_list(int* num) {
  auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
  if (!list) return nullptr;
  list[0] = &emu_device;
  if (num) *num = 1;
  return list;
}
void ibv_free_device_list(ibv_device** list) { std::free(list); }
const char* ibv_get_device_name(ibv_device* d) { return d->name; }

ibv_context* ibv_open_device(ibv_device* d) {
  if (!own_mrs()) return nullptr;
  auto* ctx = new ibv_context{};
  ctx->device = d;
  ctx->ops.post_send = post_send;
  ctx->ops.post_recv = post_recv;
  ctx->ops.poll_cq = poll_cq;
  ctx->ops.req_notify_cq = req_notify_cq;
  ctx->async_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);  // no async event ever: never readable
  if (ctx->async_fd < 0) {
    delete ctx;
    return nullptr;
  }
  ++own().contexts;
  ctx->cmd_fd = -1;
  ctx->abi_compat = nullptr;  // not extended: query_port takes the exported symbol
  return ctx;
}
int ibv_close_device(ibv_context* ctx) {
  ::close(ctx->async_fd);
  delete ctx;
  own_state& s = own();
  if (--s.contexts == 0 && s.mrs) {
    ::munmap(s.mrs, sizeof(mr_file));
    s.mrs = nullptr;
    ::unlink(mr_path(s.pid).c_str());
  }
  return 0;
}
int ibv_get_async_event(ibv_context*, ibv_async_event*) {
  errno = EAGAIN;
  return -1;
}
void ibv_ack_async_event(ibv_async_event*) {}

int ibv_query_device(ibv_context*, ibv_device_attr* a) {
  *a = ibv_device_attr{};
  std::snprintf(a->fw_ver, sizeof a->fw_ver, "emulated");
  a->phys_port_cnt = 1;
  a->max_qp = 1 << 16;
  a->max_qp_wr = 1 << 15;
  a->max_cqe = 1 << 22;
  a->max_mr_size = ~0ull;
  a->max_sge = 1;
  return 0;
}
int(ibv_query_port)(ibv_context*, uint8_t port, _compat_ibv_port_attr* compat) {
  if (port != 1) return EINVAL;
  auto* a = reinterpret_cast<ibv_port_attr*>(compat);  // the caller's full struct, zeroed (verbs.h)
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = 1;
  a->max_msg_sz = 1u << 31;
  a->lid = 1;
  a->active_width = 2;   // 4x
  a->active_speed = 32;  // EDR
  a->phys_state = 5;     // LinkUp
  a->link_layer = IBV_LINK_LAYER_INFINIBAND;
  return 0;
}
int _ibv_query_gid_ex(ibv_context*, uint32_t port, uint32_t index, ibv_gid_entry* e, uint32_t, size_t) {
  if (port != 1 || index != 0) return ENODATA;
  *e = ibv_gid_entry{};
  const unsigned char gid[16] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0xe3, 0x11, 0xff, 0xfe, 0, 0, 0x01};
  std::memcpy(e->gid.raw, gid, 16);
  e->gid_index = 0;
  e->port_num = 1;
  e->gid_type = IBV_GID_TYPE_IB;
  return 0;
}

int ibv_fork_init(void) { return 0; }
const char* ibv_wc_status_str(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "success";
    case IBV_WC_LOC_PROT_ERR: return "local protection error";
    case IBV_WC_WR_FLUSH_ERR: return "Work Request Flushed Error";
    case IBV_WC_REM_ACCESS_ERR: return "remote access error";
    case IBV_WC_RETRY_EXC_ERR: return "transport retry counter exceeded";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "RNR retry counter exceeded";
    default: return "unknown";
  }
}
const char* ibv_event_type_str(ibv_event_type) { return "emulated event"; }

ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  auto* pd = new ibv_pd{};
  pd->context = ctx;
  return pd;
}
int ibv_dealloc_pd(ibv_pd* pd) {
  delete pd;
  return 0;
}

ibv_mr*(ibv_reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) {
  std::lock_guard<std::mutex> g(lock());
  mr_file* f = own_mrs();
  static std::uint32_t next_key = 0x100;
  for (auto& e : f->mr) {
    if (e.rkey.load() != 0) continue;
    auto* mr = new ibv_mr{};
    mr->context = pd->context;
    mr->pd = pd;
    mr->addr = addr;
    mr->length = length;
    mr->lkey = mr->rkey = ++next_key;
    e.access = static_cast<std::uint32_t>(access);
    e.addr = reinterpret_cast<std::uintptr_t>(addr);
    e.length = length;
    e.rkey.store(mr->rkey);
    return mr;
  }
  errno = ENOMEM;
  return nullptr;
}
ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t, unsigned int access) {
  return (ibv_reg_mr)(pd, addr, length, static_cast<int>(access));
}
int ibv_dereg_mr(ibv_mr* mr) {
  std::lock_guard<std::mutex> g(lock());
  for (auto& e : own_mrs()->mr)
    if (e.rkey.load() == mr->rkey) e.rkey.store(0);
  delete mr;
  return 0;
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* ctx) {
  static std::atomic<int> n{0};
  auto* c = new emu_channel();
  c->path = dir() + "/cclite-emuibv-ch-" + std::to_string(::getpid()) + "-" + std::to_string(n++);
  ::unlink(c->path.c_str());
  if (::mkfifo(c->path.c_str(), 0600) != 0) {
    delete c;
    return nullptr;
  }
  c->ch.context = ctx;
  c->ch.fd = ::open(c->path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);  // RDWR: never blocks, never EOF
  if (c->ch.fd < 0) {
    ::unlink(c->path.c_str());
    delete c;
    return nullptr;
  }
  return &c->ch;
}
int ibv_destroy_comp_channel(ibv_comp_channel* ch) {
  auto* c = reinterpret_cast<emu_channel*>(ch);
  ::close(ch->fd);
  ::unlink(c->path.c_str());
  delete c;
  return 0;
}
int ibv_get_cq_event(ibv_comp_channel* ch, ibv_cq** cq, void** ctx) {
  char buf[256];
  if (::read(ch->fd, buf, sizeof buf) <= 0) return -1;  // EAGAIN: nothing arrived (fd is non-blocking)
  auto* c = reinterpret_cast<emu_channel*>(ch);
  if (!c->cq) return -1;
  *cq = &c->cq->cq;
  *ctx = c->cq->cq.cq_context;
  return 0;
}
void ibv_ack_cq_events(ibv_cq*, unsigned int) {}

ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* ch, int) {
  auto* c = new emu_cq();
  c->cq.context = ctx;
  c->cq.channel = ch;
  c->cq.cq_context = cq_context;
  c->cq.cqe = cqe;
  if (ch) reinterpret_cast<emu_channel*>(ch)->cq = c;
  return &c->cq;
}
int ibv_destroy_cq(ibv_cq* cq) {
  auto* c = reinterpret_cast<emu_cq*>(cq);
  if (cq->channel) reinterpret_cast<emu_channel*>(cq->channel)->cq = nullptr;
  delete c;
  return 0;
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* ia) {
  if (ia->qp_type != IBV_QPT_RC || !ia->send_cq || !ia->recv_cq) {
    errno = EINVAL;
    return nullptr;
  }
  static std::mt19937 rng(static_cast<unsigned>(::getpid()) * 2654435761u);
  auto* q = new emu_qp();
  for (int tries = 0; tries < 100 && !q->mine; ++tries) {
    q->qp.qp_num = (rng() & 0xffffff) | 1;
    q->mine = map_file<qp_file>(qp_path(q->qp.qp_num), true);  // O_EXCL: a number no live QP has
  }
  if (!q->mine) {
    delete q;
    errno = ENOMEM;
    return nullptr;
  }
  q->mine->pid = ::getpid();
  q->mine->alive.store(1);
  if (ia->recv_cq->channel)
    std::snprintf(q->mine->channel, sizeof q->mine->channel, "%s",
                  reinterpret_cast<emu_channel*>(ia->recv_cq->channel)->path.c_str());
  q->qp.context = pd->context;
  q->qp.pd = pd;
  q->qp.send_cq = ia->send_cq;
  q->qp.recv_cq = ia->recv_cq;
  q->qp.qp_context = ia->qp_context;
  q->qp.qp_type = IBV_QPT_RC;
  q->qp.state = IBV_QPS_RESET;
  std::lock_guard<std::mutex> g(lock());
  reinterpret_cast<emu_cq*>(ia->recv_cq)->qps.push_back(q);
  return &q->qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
  std::lock_guard<std::mutex> g(lock());
  auto* q = reinterpret_cast<emu_qp*>(qp);
  if (!(mask & IBV_QP_STATE)) return 0;
  const ibv_qp_state from = qp->state, to = a->qp_state;
  const bool ok = (from == IBV_QPS_RESET && to == IBV_QPS_INIT) || (from == IBV_QPS_INIT && to == IBV_QPS_RTR) ||
                  (from == IBV_QPS_RTR && to == IBV_QPS_RTS) || to == IBV_QPS_ERR || to == IBV_QPS_RESET;
  if (!ok) return EINVAL;
  if (to == IBV_QPS_RTR) {
    if (!(mask & IBV_QP_DEST_QPN)) return EINVAL;
    q->remote = map_file<qp_file>(qp_path(a->dest_qp_num), false);  // none: sends fail with retry exceeded
    if (q->remote) {
      q->remote_mrs = map_file<mr_file>(mr_path(q->remote->pid), false);
      q->remote_pidfd = static_cast<int>(::syscall(SYS_pidfd_open, q->remote->pid, 0));
      if (q->remote->channel[0]) q->remote_wake = ::open(q->remote->channel, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    }
  }
  if (to == IBV_QPS_RTS && (mask & IBV_QP_TIMEOUT) && (mask & IBV_QP_RETRY_CNT))
    q->retries = std::chrono::nanoseconds(4096LL << std::min<int>(a->timeout, 31)) * (a->retry_cnt + 1);
  qp->state = to;
  return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
  std::lock_guard<std::mutex> g(lock());
  auto* q = reinterpret_cast<emu_qp*>(qp);
  auto& v = reinterpret_cast<emu_cq*>(qp->recv_cq)->qps;
  for (auto it = v.begin(); it != v.end(); ++it)
    if (*it == q) {
      v.erase(it);
      break;
    }
  q->mine->alive.store(0);
  ::unlink(qp_path(qp->qp_num).c_str());
  ::munmap(q->mine, sizeof(qp_file));
  if (q->remote) ::munmap(q->remote, sizeof(qp_file));
  if (q->remote_mrs) ::munmap(q->remote_mrs, sizeof(mr_file));
  if (q->remote_wake >= 0) ::close(q->remote_wake);
  if (q->remote_pidfd >= 0) ::close(q->remote_pidfd);
  delete q;
  return 0;
}

}  // extern "C"
