// tools/run/placement.hpp - what the members of a rendezvous round decide for
// their workers: where the workers meet (MASTER_ADDR) and which ranks each node
// runs. Pure functions of the round's node list, so every node computes the
// same answer without another exchange (agent.hpp reads the list from the
// agents' store: node/<k> = "host addr nproc pid hosting").
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "job.hpp"
#include "net.hpp"

namespace cclite::run {

/// One member of a round.
struct node_info {
  std::string host;  ///< host name (for messages)
  std::string addr;  ///< address the other nodes reach it at
  int nproc = 0;
  long pid = 0;
  int hosting = 0;  ///< 1: its agent hosts the agents' store (it owns the endpoint)
};

/// "host addr nproc pid hosting", as a node publishes itself.
inline std::string to_record(const node_info& n) {
  return n.host + " " + n.addr + " " + std::to_string(n.nproc) + " " + std::to_string(n.pid) + " " +
         std::to_string(n.hosting);
}
inline node_info parse_node_record(const std::string& v) {
  node_info n;
  std::istringstream in(v);
  in >> n.host >> n.addr >> n.nproc >> n.pid >> n.hosting;
  return n;
}

/// MASTER_ADDR of the round, the same on every node: `forced` (--master-addr)
/// if given, else node 0's address. When node 0 owns the endpoint and no
/// interface is forced (CCLITE_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), the
/// endpoint's own host instead: every node just reached it by that name,
/// while the address node 0 guessed for itself may be a loopback alias of its
/// name. Returns "" or why the round cannot work: a loopback address for a
/// job that spans several hosts (said now, not after the workers time out
/// connecting to themselves).
inline std::string choose_master_addr(const std::vector<node_info>& nodes, const std::string& forced,
                                      const std::string& endpoint_host, bool interface_forced,
                                      std::string& master) {
  if (nodes.empty()) return "the round has no nodes";
  master = !forced.empty()                           ? forced
           : nodes[0].hosting && !interface_forced ? endpoint_host
                                                   : nodes[0].addr;
  bool other_host = false;
  for (const node_info& n : nodes) other_host = other_host || n.host != nodes[0].host;
  if (other_host && is_loopback(master))
    return "node 0 (host " + nodes[0].host + ") would be reached at " + master +
           ", a loopback address, but the job spans several hosts; set CCLITE_SOCKET_IFNAME to "
           "an interface the nodes share, and give --rdzv-endpoint as an address or name the "
           "other nodes can reach";
  return {};
}

/// Node `me`'s place in the round: its node rank, the round's node count,
/// its first global rank (the ranks of the nodes before it, in node order)
/// and the world size (every node's nproc; nodes may differ).
inline void place_node(const std::vector<node_info>& nodes, int me, rendezvous& r) {
  r.node_rank = me;
  r.group_size = static_cast<int>(nodes.size());
  r.rank_offset = 0;
  r.world_size = 0;
  for (int k = 0; k < static_cast<int>(nodes.size()); ++k) {
    if (k < me) r.rank_offset += nodes[k].nproc;
    r.world_size += nodes[k].nproc;
  }
}

}  // namespace cclite::run
